"""Builds picker's optional native hot paths (``picker.scheduling._native``, ``picker.kvcache._native``); the rest
is in pyproject.toml.

The extension is optional: without a C compiler or Python's headers the install goes on and picker uses the
pure-Python twins in ``picker/scheduling/plugins/prefix_index.py`` (docs/performance.md, issue 13).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "picker.scheduling._native",
            ["picker/scheduling/_native.c"],
            depends=["picker/xxhash_spec.h"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # float results as Python computes them
            optional=True,
        ),
        Extension(
            "picker.kvcache._native",
            ["picker/kvcache/_native.c"],
            depends=["picker/xxhash_spec.h"],
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
