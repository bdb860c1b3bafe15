"""``python -m aprof._merge``: a worker process of ``aprof merge`` (``parallel.py``)."""

from aprof._merge.parallel import serve

serve()
