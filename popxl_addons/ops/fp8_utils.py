"""Floating point format descriptions used by the float8 scale ops."""

from __future__ import annotations

from typing import NamedTuple


class FpDef(NamedTuple):
    """A binary floating point format."""

    num_exp_bits: int
    num_mantissa_bits: int
    fix_exponent_bias: int  # added to the stored exponent
    include_denorm: bool  # whether denormal values are part of the format
    has_nans: bool  # whether a whole exponent code represents NaN
    max_value: float  # largest finite value
    max_exp: int  # largest exponent
    min_exp: int  # smallest exponent (of denormals, where included)


ieee_fp32_no_denorms = FpDef(8, 23, 127, False, True, 3.4028235e38, 127, -126)
ieee_fp16_denorms = FpDef(5, 10, 15, True, True, 65504, 15, -14)
float8_152_def = FpDef(5, 2, 16, True, False, 57344, 15, -17)
float8_143_def = FpDef(4, 3, 8, True, False, 240, 7, -10)

__all__ = [
    "FpDef",
    "float8_143_def",
    "float8_152_def",
    "ieee_fp16_denorms",
    "ieee_fp32_no_denorms",
]
