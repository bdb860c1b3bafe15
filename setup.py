"""The one compiled part of aprof, the timeline's recorder; everything else is in pyproject.toml.

The extension is optional: with ``APROF_NO_EXTENSIONS`` set (to anything but ``0``), or where it
fails to build (no C compiler: setuptools says so and goes on), aprof installs without it and
runs the recorder's pure-Python twin (``aprof/_timeline/pyrecorder.py``).
"""

import os

from setuptools import Extension, setup

no_extensions = os.environ.get("APROF_NO_EXTENSIONS", "") not in ("", "0")
recorder = Extension("aprof._timeline._recorder", ["aprof/_timeline/_recorder.c"], optional=True)
setup(ext_modules=[] if no_extensions else [recorder])
