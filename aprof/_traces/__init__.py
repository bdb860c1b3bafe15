"""Chrome trace JSON files, as the merge, the report and the servers' forward-step counters
read them.

- ``files.py``: which files are traces (SGLang's ranks and its own merged copy among them),
  opening one below ``save_path`` following no link, one of aprof's timeline parts read whole,
  and why one could not be read;
- ``stream.py``: :class:`TraceStream`, a trace read event by event in batches, memory flat
  whatever its size, and the clock it is on;
- ``iterations.py``: what each engine's trace calls one iteration (one forward step).
"""
