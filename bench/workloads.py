"""This module owns the benchmark's workloads, the models and input sets it times:
all-MiniLM-L6-v2 on the 100 default texts, and a seeded random-init timm vit_base_patch16_224 on
100 images, the 21 package images of :func:`fixtures.inputs.default_images`, each also
horizontally flipped and cropped (deterministic variants, written as PNG to a temporary folder and
read back through :func:`fixtures.inputs.load_image_dir`), 105 candidates of which the seeded
selection takes 100. ``--quick`` takes 8 texts and 3 images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VARIANTS = ("orig", "hflip", "crop-tl", "crop-br", "hflip-crop-c")


def expanded_image_folder(folder: Path) -> list[str]:
    """Write each default package image in the deterministic variants :data:`VARIANTS` as PNG.

    Crops keep 75% (tl, br) or 60% (centre) of each side; ``hflip`` mirrors left-right. Returns
    notes describing the set.
    """
    from PIL import Image

    from fixtures import inputs

    base = inputs.default_images(None, seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, img in zip(base.names, base.items):
        w, h = img.size
        flip = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        variants = {
            "orig": img,
            "hflip": flip,
            "crop-tl": img.crop((0, 0, int(0.75 * w), int(0.75 * h))),
            "crop-br": img.crop((w - int(0.75 * w), h - int(0.75 * h), w, h)),
            "hflip-crop-c": flip.crop((int(0.2 * w), int(0.2 * h), int(0.2 * w) + int(0.6 * w),
                                       int(0.2 * h) + int(0.6 * h))),
        }
        stem = name.replace(":", "_").replace(".", "_")
        for variant in VARIANTS:
            variants[variant].save(folder / f"{stem}__{variant}.png")
    return [f"{len(base.names)} package images (fixtures.inputs.default_images) x {len(VARIANTS)} "
            f"deterministic variants {VARIANTS} = {len(base.names) * len(VARIANTS)} candidates; "
            "the seeded selection of fixtures.inputs.load_image_dir takes n of them"]


@dataclass
class BenchModel:
    name: str
    spec: Any
    n_samples: int
    images: str | None = None
    notes: list[str] = field(default_factory=list)


def model_configs(which: list[str], quick: bool, workdir: Path) -> list[BenchModel]:
    from fixtures.models.catalogue import REGISTRY, ModelSpec

    out = []
    for name in which:
        if name == "minilm":
            out.append(BenchModel("minilm", REGISTRY["all-MiniLM-L6-v2"], 8 if quick else 100,
                                  notes=["default texts (fixtures/data/sentences.txt)"]))
        elif name == "vit_base":
            spec = ModelSpec(key="bench-vit_base_patch16_224-random", family="timm-vit",
                             source="random", arch="vit_base_patch16_224", modality="image",
                             n_layers=12, n_heads=12, head_dim=64, seed=0, control=True,
                             label="timm vit_base_patch16_224, random init (seed 0), "
                                   "benchmark only")
            folder = workdir / "images"
            notes = expanded_image_folder(folder)
            out.append(BenchModel("vit_base", spec, 3 if quick else 100, images=str(folder),
                                  notes=notes))
        else:
            raise SystemExit(f"unknown benchmark model {name!r}; use minilm and/or vit_base")
    return out
