"""Rotary positional embeddings (RoPE)."""

from .rotary_pos_embed import rotary_pos_embed as rotary_pos_embed
from .rotary_pos_embed import trig_table_constants as trig_table_constants
from .rotary_pos_embed import trig_tables as trig_tables

__all__ = ["rotary_pos_embed", "trig_table_constants", "trig_tables"]
