"""Imported last by the fork server (netsense.emulation.forked), after the trainer: every object the imports made
is moved out of the garbage collector's reach (gc.freeze), so a worker's collections do not write to the pages
it shares with the server and its siblings (a write copies the page into the worker's own memory)."""

import gc

gc.freeze()
