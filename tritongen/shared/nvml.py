"""NVML through `pynvml` (nvidia-ml-py), the one wrapper the sidecar's headroom, the profiler's
memory probe and `check`'s GPU count share.

The module is injected (tests pass a fake with the same functions; None imports `pynvml`), and
every failure, from a missing library to a host without a driver (`NVMLError_LibraryNotFound`),
becomes one `NvmlUnavailable` whose message names the NVML error, so callers decide what a
missing GPU means for them (a failed headroom source, no probe, an unknown count).
"""

from __future__ import annotations

from typing import Any


class NvmlUnavailable(Exception):
    """NVML cannot answer here; str() says why."""


def nvml_message(err: BaseException) -> str:
    """An NVML error as one line that names its type (pynvml's messages often do not)."""
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}" if type(err).__name__ not in text else text


class Nvml:
    """An NVML session: `init()` once, read devices by index, `shutdown()`."""

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self.initialised = False

    @property
    def module(self) -> Any:
        if self._module is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError as err:  # pragma: no cover - a declared dependency
                raise NvmlUnavailable(f"NVML unavailable: pynvml is not installed ({err})") from None
            self._module = pynvml
        return self._module

    def init(self) -> None:
        if self.initialised:
            return
        nvml = self.module
        try:
            nvml.nvmlInit()
        except Exception as err:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML unavailable: {nvml_message(err)}") from None
        self.initialised = True

    def shutdown(self) -> None:
        if self.initialised:
            try:
                self.module.nvmlShutdown()
            except Exception:
                pass
            self.initialised = False

    def count(self) -> int:
        try:
            return int(self.module.nvmlDeviceGetCount())
        except Exception as err:
            raise NvmlUnavailable(f"NVML cannot count devices: {nvml_message(err)}") from None

    def handle(self, index: int) -> Any:
        try:
            return self.module.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            raise NvmlUnavailable(f"NVML cannot read gpu{index}: {nvml_message(err)}") from None

    def memory(self, handle: Any, index: int | None = None) -> tuple[int, int]:
        """(total, used) bytes of a device."""
        try:
            mem = self.module.nvmlDeviceGetMemoryInfo(handle)
        except Exception as err:
            raise NvmlUnavailable(f"NVML cannot read gpu{'' if index is None else index}: {nvml_message(err)}") from None
        return int(getattr(mem, "total", 0)), int(mem.used)

    def utilization(self, handle: Any) -> float | None:
        """The device's busy fraction, or None where it is not supported (MIG slices)."""
        try:
            return float(self.module.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
        except Exception:
            return None


def gpu_count(module: Any = None) -> int | None:
    """How many GPUs NVML reports here; None when it cannot tell (no library, no driver)."""
    nvml = Nvml(module)
    try:
        nvml.init()
        return nvml.count()
    except NvmlUnavailable:
        return None
    finally:
        nvml.shutdown()
