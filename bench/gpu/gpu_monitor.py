"""What the GPU's clocks, temperatures and power were while a phase of a benchmark ran, read by nvidia-smi.

Session 32 saw sweeps and single measurements read 10-18 % slow right after heavy DRAM traffic (a 4 GiB copy,
the decode table's B = 64 cells) with nothing in the JSON to say why. A phase now runs beside
`nvidia-smi --query-gpu=... -lms 200`, and its samples are summed up next to its timings. Read-only: nothing here
sets a clock, a power limit or a mode. On a machine without nvidia-smi every summary is empty.

    monitor = GpuMonitor(torch.cuda.current_device())
    with monitor.phase("copy") as state:
        ...                      # the timed work
    print(state)                 # {"samples": 12, "sm_mhz_min": 1755, ...}
"""
import contextlib
import statistics
import subprocess

import torch

FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "temperature.memory", "power.draw",
          "clocks_event_reasons.active")


def _number(text):
    try:
        return float(text)
    except ValueError:  # "N/A", "[Not Supported]"
        return None


def summarize(lines):
    """The samples' range: SM clock (min / median / max), memory clock (min), temperatures and power (max), and
    the clock-event reasons that any sample reported, OR-ed (nvidia-smi's bit mask: 0x4 software power cap, 0x20
    software thermal slowdown, 0x40 hardware thermal slowdown, 0x80 hardware power brake)."""
    samples = []
    for line in lines:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        sm, mem, temp, mem_temp, power = (_number(part) for part in parts[:5])
        try:
            reasons = int(parts[5], 16)
        except ValueError:
            reasons = 0
        if sm is not None:
            samples.append((sm, mem, temp, mem_temp, power, reasons))
    if not samples:
        return {"samples": 0}

    def present(index):
        return [sample[index] for sample in samples if sample[index] is not None]

    sm = present(0)
    state = {"samples": len(samples), "sm_mhz_min": min(sm), "sm_mhz_median": statistics.median(sm),
             "sm_mhz_max": max(sm)}
    for key, index, pick in (("mem_mhz_min", 1, min), ("temp_c_max", 2, max), ("mem_temp_c_max", 3, max),
                             ("power_w_max", 4, max)):
        values = present(index)
        if values:
            state[key] = pick(values)
    reasons = 0
    for sample in samples:
        reasons |= sample[5]
    state["clock_event_reasons"] = hex(reasons)
    return state


class GpuMonitor:
    def __init__(self, device):
        props = torch.cuda.get_device_properties(device)
        bus = getattr(props, "pci_bus_id", None)
        domain = getattr(props, "pci_domain_id", 0)
        device_id = getattr(props, "pci_device_id", 0)
        # nvidia-smi's -i takes the PCI address, which does not depend on CUDA_VISIBLE_DEVICES' order; where it
        # refuses the address, the first GPU it lists.
        self.select = ["-i", f"{domain:08x}:{bus:02x}:{device_id:02x}.0"] if bus is not None else []
        if self.select:
            try:
                probe = subprocess.run(["nvidia-smi", *self.select, "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30)
                if probe.returncode != 0:
                    self.select = []
            except (OSError, subprocess.TimeoutExpired):
                self.select = []

    @contextlib.contextmanager
    def phase(self, name):
        """Samples every 200 ms while the block runs; the summary dict (with the phase's name) fills on exit."""
        state = {"phase": name}
        try:
            process = subprocess.Popen(["nvidia-smi", *self.select, f"--query-gpu={','.join(FIELDS)}",
                                        "--format=csv,noheader,nounits", "-lms", "200"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            process = None
        try:
            yield state
        finally:
            lines = []
            if process is not None:
                process.terminate()
                try:
                    lines = process.communicate(timeout=10)[0].splitlines()
                except subprocess.TimeoutExpired:
                    process.kill()
                    lines = process.communicate()[0].splitlines()
            state.update(summarize(lines))


def describe(state):
    """One line for a log: 'SM 1755-1980 MHz, mem 3201 MHz, 52 C (HBM 61 C), 512 W, reasons 0x4'."""
    if not state.get("samples"):
        return "no nvidia-smi samples"
    text = f"SM {state['sm_mhz_min']:.0f}-{state['sm_mhz_max']:.0f} MHz"
    if "mem_mhz_min" in state:
        text += f", mem {state['mem_mhz_min']:.0f} MHz"
    if "temp_c_max" in state:
        text += f", {state['temp_c_max']:.0f} C"
    if "mem_temp_c_max" in state:
        text += f" (HBM {state['mem_temp_c_max']:.0f} C)"
    if "power_w_max" in state:
        text += f", {state['power_w_max']:.0f} W"
    return text + f", reasons {state['clock_event_reasons']} ({state['samples']} samples)"
