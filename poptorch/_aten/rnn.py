"""Recurrent layers: RNN, LSTM, GRU (as device-side loops)."""

from __future__ import annotations
