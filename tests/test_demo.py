"""The demo runs end to end on the shipped models and writes its plot and numbers."""

import json

import pytest

from xkernels.models.shipped import WEIGHTS


@pytest.mark.skipif(not (WEIGHTS / "refiner.safetensors").exists(), reason="the models are not trained yet")
def test_demo_writes_tables_plot_and_json(tmp_path):
    from xkernels.demo import format_tables, run_demo

    report = run_demo(prompts=1, tokens=12, passes=(1, 2), iters=2, out=tmp_path)
    for domain in ("code", "math"):
        sweep = report["tau_by_verified_tokens"][domain]
        assert set(sweep["chain"]) == {4, 8, 15} and set(sweep["tree"]) == {4, 8, 16, 32}
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert set(saved["domains"]) == {"code", "math"}
    for rows in saved["domains"].values():
        modes = {"drafter", "sequential", "jacobi", "tree", "tree-jacobi"}
        assert set(rows) == {"ar", "jacobi-1 (all)"} | modes | {f"{m} (all)" for m in modes}
        assert all(rows[f"{m} (all)"]["drafted"] == 1.0 for m in modes)
        assert all(r["same_tokens_as_ar"] for r in rows.values())
        assert rows["ar"]["tau"] == 1.0 and rows["ar"]["speedup"] == 1.0
        assert all(r["tau"] >= 1.0 for r in rows.values())
    table = format_tables(report)
    assert "code" in table and "math" in table and "jacobi-1 (all)" in table


@pytest.mark.skipif(not (WEIGHTS / "block_diffusion.safetensors").exists(), reason="the model is not trained yet")
def test_diffusion_demo_writes_tables_plot_and_json(tmp_path):
    from xkernels.demo_diffusion import KEEPS, format_diffusion_tables, run_diffusion_demo

    report = run_diffusion_demo(prompts=1, tokens=12, keep=2, out=tmp_path)
    assert (tmp_path / "demo_diffusion.png").stat().st_size > 0
    saved = json.loads((tmp_path / "demo_diffusion.json").read_text())
    for rows in saved["domains"].values():
        assert {"vanilla", "threshold", "spiffy-2", "spiffy-2+threshold"} <= set(rows)
        assert {f"spiffy-{k}" for k in KEEPS} <= set(rows)
        assert all(r["same_as_vanilla"] for r in rows.values())
        assert rows["vanilla"]["nfe_reduction"] == 1.0
    table = format_diffusion_tables(report)
    assert "spiffy-2+threshold" in table and "NFE" in table


def test_the_command_line_parses_the_demo_options(capsys):
    from xkernels.__main__ import main

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--keep" in capsys.readouterr().out
