"""Dtype lists for tests."""

from __future__ import annotations

from . import dtypes


def get_all_int_dtypes(include_signed: bool = True, include_unsigned: bool = True) -> list:
    signed = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]
    unsigned = [dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
    return (signed if include_signed else []) + (unsigned if include_unsigned else [])


def get_all_dtypes() -> list:
    return get_all_int_dtypes() + [
        dtypes.float8_143,
        dtypes.float8_152,
        dtypes.float16,
        dtypes.float32,
        dtypes.float64,
        dtypes.complex64,
        dtypes.complex128,
    ]


__all__ = ["get_all_dtypes", "get_all_int_dtypes"]
