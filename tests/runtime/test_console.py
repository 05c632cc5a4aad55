"""The one console module: a bar that prints plain lines into logs, and tables."""
import io

from jaxpod.runtime import console


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_bar_prints_plain_lines_when_not_a_terminal():
  out = io.StringIO()
  bar = console.Bar("train", 10, fields=(("loss", "loss {}"),), stream=out, plain_every_s=0)
  bar.update(completed=4, loss="0.5000")
  bar.update(advance=1)
  bar.close()
  lines = out.getvalue().splitlines()
  assert len(lines) == 3 and lines[0].startswith("train 4/10 (40%) loss 0.5000 ")
  assert lines[-1].startswith("train 5/10 (50%) loss 0.5000") and "eta" in lines[-1]


def test_bar_is_silent_when_disabled_and_rich_on_a_terminal():
  quiet = io.StringIO()
  bar = console.Bar("x", 3, stream=quiet, enabled=False, plain_every_s=0)
  bar.update(advance=3)
  bar.close()
  assert quiet.getvalue() == ""
  term = _Terminal()
  bar = console.Bar("extract", 3, fields=(("tok_s", "{} tok/s"),), stream=term)
  bar.update(advance=3, tok_s="12")
  bar.close()
  assert "extract" in term.getvalue() and "3/3" in term.getvalue() and "12 tok/s" in term.getvalue()


def test_table_formats_floats_and_columns():
  out = io.StringIO()
  console.print_table("bench", ["kind", "p50 ms"], [("raw", 0.12345), ("jaxpod", 2)], stream=out)
  text = out.getvalue()
  assert "bench" in text and "0.123" in text and "jaxpod" in text and "p50 ms" in text
