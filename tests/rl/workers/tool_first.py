"""A test environment for launched `jaxpod rl` clusters (importable there as `tool_first:ToolFirst`, this folder being
the hosts' script folder): the calculator, except that an untrained policy's first turn is answered too."""
from jaxpod.problems.calculator import CALL, Calculator


class ToolFirst(Calculator):
  """The calculator; a first turn that is no tool call is answered `= error` (an untrained policy calls no tool, and
  a test of episodes needs observations without paying for a warm-up)."""

  turns = 0

  def step(self, completion: str) -> tuple[str, float, bool]:
    self.turns += 1
    if self.turns == 1 and not completion.strip().startswith(CALL):
      return "= error\n", 0.0, False
    return super().step(completion)
