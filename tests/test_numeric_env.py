"""The numeric environment recorded in results.json and the trained series (method §13)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from fixtures import numeric_env
from report.sections.provenance_section import provenance_context
from report.index import Index

ROOT = Path(__file__).resolve().parent.parent

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512dq amx_tile
processor\t: 1
model name\t: ignored second CPU
"""


def test_cpu_info_reads_model_and_dispatch_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    info = numeric_env.cpu_info(str(path))
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["vendor"] == "GenuineIntel"
    assert info["flags"] == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                             "avx512dq", "amx_tile"]
    assert numeric_env.supports_avx512(info)
    assert not numeric_env.supports_avx512({"flags": ["avx2", "avx512f"]})
    assert numeric_env.cpu_info(str(tmp_path / "absent"))["flags"] == []


def test_collect_names_dispatch_blas_threads_and_env(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    env = numeric_env.collect()
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["threads"]["intra_op"] == torch.get_num_threads()
    assert env["env"]["MKL_CBWR"] == "COMPATIBLE" and "ONEDNN_MAX_CPU_ISA" not in env["env"]
    assert env["blas"]["torch"]["blas"]  # mkl, openblas, …: read from torch's build config
    json.dumps(env)  # JSON-ready


def test_pinned_environment_is_detected_only_in_a_pinned_process():
    assert not numeric_env.is_pinned() or os.environ.get("ATEN_CPU_CAPABILITY") == "default"
    from fixtures.training.pinned import pinned_environ

    env = pinned_environ(1)
    code = "from fixtures import numeric_env; print(numeric_env.is_pinned())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_report_shows_the_numeric_environment_beside_the_versions():
    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    results["provenance"]["numeric_environment"] = {"torch_cpu_capability": "AVX2",
                                                    "cpu": {"model": "AMD EPYC"}}
    ctx = provenance_context(results, Index(results))
    assert ("torch_cpu_capability", "AVX2") in ctx["numeric"]
    assert ("cpu.model", "AMD EPYC") in ctx["numeric"]
    assert all(k != "numeric_environment" for k, _ in ctx["run"])
