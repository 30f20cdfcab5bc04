"""Build script for the one compiled part: core/_ntkernel.c (see its header).

Everything else is declared in pyproject.toml. The extension is optional: without a C compiler
(or on a CPU without AVX-512) headgraph installs and runs on its torch path, only slower.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3"]

setup(ext_modules=[Extension("headgraph.core._ntkernel", ["core/_ntkernel.c"],
                             extra_compile_args=flags, optional=True)])
