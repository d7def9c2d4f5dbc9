"""sglang-edgeacc: a downstream layer of SGLang, loaded as an SGLang plugin.

Importing this package is cheap and imports neither sglang nor torch; the
mechanisms that need the GPU live in :mod:`sglang_edgeacc.edge_acc` and import
torch only, the modules that wire them into SGLang import sglang lazily.
"""

__version__ = "0.1.0"
SGLANG_PIN = "0.5.23"
