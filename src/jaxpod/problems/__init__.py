"""jaxpod.problems: what is solved, below rl/ and tasks/ and importing no JAX: problem sets (generated addition
and sort, a prompt file, the calculator and the python tool with their environments), the environment protocol and episode records,
rewards, answer verifiers and pass@k.

Importing the package registers the built-in problem sets (`ProblemSet`'s choices for `--problems.type`).
"""
from jaxpod.problems import calculator, dataset, generated, python_tool  # noqa: F401 - the registry: built-in problem sets
from jaxpod.problems.base import EVAL_STREAM, Problem, ProblemSet
from jaxpod.problems.calculator import CalculatorProblems
from jaxpod.problems.dataset import DatasetProblems
from jaxpod.problems.generated import AdditionProblems, SortProblems
from jaxpod.problems.python_tool import PythonProblems
