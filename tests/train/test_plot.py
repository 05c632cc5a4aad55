"""`jaxpod plot RUN_DIR` writes a PNG of the loss and accuracy curves."""
import json

from jaxpod.cli.main import main


def test_plot_writes_a_png(tmp_path, capsys):
  lines = [{"step": s, "loss": 2.0 / s, "lm_loss": 1.5 / s, "accuracy": s / 20, "exact_accuracy": s / 40}
           for s in range(1, 21)]
  lines.append({"step": 20, "eval/exact_accuracy": 0.4, "eval/accuracy": 0.8})
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(l) for l in lines) + "\n{torn")
  assert main(["plot", str(tmp_path)]) == 0
  png = tmp_path / "metrics.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert str(png) in capsys.readouterr().out


def test_plot_names_a_missing_run(tmp_path, capsys):
  assert main(["plot", str(tmp_path / "nope")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "metrics.jsonl not found" in err[0]
