"""The builder of the kinds whose side is a Python module (triton, cutedsl, python): each side's <entry>.py,
imported by the one loader as package kp_<side> over the side's folder."""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

from ..taskspec import BuildSpec, TaskSpec
from .base import Builder, Built, module_name


class ModuleBuilder(Builder):
    """triton, cutedsl, python: the side is its <entry>.py, imported as package kp_<side> over the side's folder."""

    def __init__(self, kind: str, description: str) -> None:
        self.kind = kind
        self.description = description

    def describe(self, build: BuildSpec) -> str:
        interpreted = " (interpreter: TRITON_INTERPRET=1)" if self.kind == "triton" and \
            os.environ.get("TRITON_INTERPRET") == "1" else ""
        return self.description + interpreted

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        self.load(spec, side, None)
        return Built()

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        return Built()  # importing a CuTe DSL side without a GPU proves little and may fail for that reason alone

    def load(self, spec: TaskSpec, side: str, module: str | None) -> types.ModuleType:
        package = module_name(side)
        if package not in sys.modules:
            holder = types.ModuleType(package)
            holder.__path__ = [str(spec.side_dir(side))]  # a package over the side's folder: relative imports work
            sys.modules[package] = holder
        return importlib.import_module(f"{package}.{spec.build.entry}")
