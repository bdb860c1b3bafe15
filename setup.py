"""The one compiled part of aprof, the timeline's recorder; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("aprof._recorder", ["aprof/_recorder.c"])])
