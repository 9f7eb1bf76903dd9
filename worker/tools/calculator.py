"""Arithmetic on a parsed AST, never `eval`: numbers, + - * / // % **, parentheses and math functions.

Every operation whose cost grows with its operands is bounded *before* it is computed (a big-int
operation holds the GIL, so a worker thread running it cannot be interrupted): powers by the result's
estimated size, multiplications by the operands' bit lengths, `round` by its digits, modular powers by
the exponent's and modulus's bit lengths, factorials by their argument. Inputs are at most 500
characters and every intermediate integer at most MAX_INT_DIGITS digits, so any expression finishes in
milliseconds (tests/test_tools.py has the bombs)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from ..errors import ToolError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
MAX_INT_DIGITS = 4_000
MAX_FACTORIAL = 1_000
MAX_INT_BITS = int(MAX_INT_DIGITS * 3.33)  # ~ MAX_INT_DIGITS decimal digits
MAX_ROUND_DIGITS = MAX_INT_DIGITS  # round(1, -10**7) would build 10**(10**7) first
MAX_MODPOW_BITS = 1_024  # pow(a, e, m) costs ~ bits(e) * bits(m)**1.6: 4096 bits each take 0.1 s, 4000 digits 4 s

def _factorial(n: float) -> int:
    if n != int(n) or n < 0:
        raise ToolError("factorial takes a non-negative whole number", "math_domain")
    if n > MAX_FACTORIAL:
        raise ToolError(f"factorial argument too large (max {MAX_FACTORIAL})", "too_large")
    return math.factorial(int(n))


def _pow(base: Any, exponent: Any, *modulus: Any) -> Any:
    if not modulus:
        _check_power(base, exponent)
    elif any(isinstance(v, int) and v.bit_length() > MAX_MODPOW_BITS for v in (exponent, *modulus)):
        raise ToolError(f"modular power too large (exponent and modulus at most {MAX_MODPOW_BITS} bits)",
                        "too_large")
    return pow(base, exponent, *modulus)


def _mul(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise ToolError(f"result has more than {MAX_INT_DIGITS} digits", "too_large")
    return left * right


def _round(number: Any, *ndigits: Any) -> Any:
    if ndigits and isinstance(ndigits[0], int) and abs(ndigits[0]) > MAX_ROUND_DIGITS:
        raise ToolError(f"round digits out of range (at most {MAX_ROUND_DIGITS} either way)", "too_large")
    return round(number, *ndigits)


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "log": math.log, "log10": math.log10, "log2": math.log2, "exp": math.exp,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos,
    "atan": math.atan, "abs": abs, "round": _round, "floor": math.floor, "ceil": math.ceil,
    "factorial": _factorial, "min": min, "max": max, "pow": _pow,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression; raises ToolError with a message meant for the model."""
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise ToolError("empty expression", "syntax")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters", "too_large")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r} as arithmetic", "syntax") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise ToolError("expression nested too deeply", "syntax") from None
    except MemoryError:
        raise ToolError("result too large", "too_large") from None
    except ZeroDivisionError:
        raise ToolError("division by zero", "division_by_zero") from None
    except OverflowError:
        raise ToolError("result too large", "too_large") from None
    except (ValueError, TypeError) as exc:
        raise ToolError(f"math error: {exc}", "math_domain") from None


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(
        node.value, bool
    ):
        return _check_size(node.value)  # 1e999 is a float literal: inf
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = _BINARY[type(node.op)](left, right)
        return _check_size(result)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r}; known constants: {', '.join(CONSTANTS)}", "unknown_name")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        func = FUNCTIONS.get(node.func.id)
        if func is None:
            raise ToolError(
                f"unknown function {node.func.id!r}; known functions: {', '.join(FUNCTIONS)}", "unknown_name"
            )
        return _check_size(func(*(_eval(a) for a in node.args)))
    raise ToolError(f"unsupported syntax: {ast.dump(node)[:60]}", "syntax")


def _check_power(base: Any, exponent: Any) -> None:
    """Refuse a power whose result is too large, before computing it: an int result has about
    log2(|base|) * exponent bits (floats overflow at once, to an OverflowError or inf)."""
    if abs(exponent) > MAX_EXPONENT and abs(base) > 1:
        raise ToolError(f"power too large (exponent above {MAX_EXPONENT})", "too_large")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1 \
            and math.log2(abs(base)) * exponent > MAX_INT_BITS:
        raise ToolError(f"result has more than {MAX_INT_DIGITS} digits", "too_large")


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result has more than {MAX_INT_DIGITS} digits", "too_large")
    if isinstance(value, complex):
        raise ToolError("result is a complex number", "math_domain")
    if isinstance(value, float) and not math.isfinite(value):  # 1e308 * 10 overflows to inf silently
        raise ToolError("result too large", "too_large")
    return value


def format_number(value: int | float) -> str:
    """Whole floats print as integers-with-.0 trimmed; others with up to 12 significant digits."""
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)
