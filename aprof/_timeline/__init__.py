"""The timeline: every span, request, step and window of a process, as one Chrome trace.

- ``timeline.py``: the ``Timeline`` a profiler records into, and its writer thread;
- ``recorder.py``: which recorder runs, the C extension (``_recorder.c``) or its pure-Python
  twin (``pyrecorder.py``), both of one contract;
- ``events.py``: the recorded event tuples;
- ``chrome_trace.py``: those tuples as a gzip'd Chrome trace JSON file;
- ``writer_process.py``, ``protocol.py``, ``writer_child.py``: the child process that formats
  and writes the files, its messages, and its program.

Nothing here may import this package's ``__init__`` names: the writer process loads
``protocol``, ``chrome_trace``, ``events`` and ``aprof._safe_files`` with the standard library
only.
"""
