"""The top level of the accelerator: N PEs with their sequencers, the links between them, and the host side.

Host side (ports flatten to Verilog as `samples__valid`, `samples__payload`, …):

- `samples`  stream of memory words (`lanes` elements, lane 0 in the low bits): for t = 0, 1, …, T−1 the
             B·⌈n_0/lanes⌉ words of x(t) then the B·⌈n_L/lanes⌉ words of y(t) (B = the micro-batch). They
             fill the sample banks of the PEs that read x and y before the run. Ready/valid: ready while no
             run is going and fewer than `max_samples` iterations are loaded; `start` rewinds the loader.
- `host_*`   the weight memories: select a PE (`host_pe`) and a word address; writes load initial weights,
             `host_r_data` follows `host_addr` by one cycle. Served while the PEs are idle.
- `samples_count` T, sampled when `start` pulses; `start` begins a run (also a second one without reset:
             arrival counters, command and cycle counters are cleared), `done` stays high after it until the
             next `start`; `cycles` counts the run's cycles (cycle 0 is the one after `start`, so it equals
             the simulator's total cycles); `ops` counts the PE commands issued; `error` (sticky until reset)
             flags a sample word offered during a run or past `max_samples`, or a link queue overflow (never
             expected: queue depths come from the lags).
- `link_stall` a test input, one bit per link in `program.links()` order: drops that link's `ready` for the
             cycle (the bench's stall injector). Tie it to 0 in a real system.

A run's cycle count is exactly the Python simulator's under the `rtl` cost model and `rtl_sim_config`.
"""

from __future__ import annotations

from typing import Any

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.hdl._compiler import PEProgram, Program
from layerpipe.hdl._datapath import mul_const
from layerpipe.hdl._link import LinkReceiver, LinkSender
from layerpipe.hdl._pe import PEConfig, ProcessingElement
from layerpipe.hdl._sequencer import Sequencer
from layerpipe.interconnect import Interconnect
from layerpipe.sim import SimConfig

__all__ = ["Accelerator", "pe_configs", "rtl_sim_config"]


def _port_of(pe: PEProgram, memory: str) -> str:
    """A PE memory as a read-port target of `PEConfig.extra_reads`."""
    return memory if memory in ("weights", "grads") else f"bank{pe.bank(memory)}"


def read_ports(program: Program, p: int) -> list[tuple[int, str]]:
    """The sender read ports of PE p beyond bank 0's, as (destination PE, memory) in port order."""
    return [(q, m) for q in program.pes[p].senders for m in program.link_sources(p, q) if m != "local"]


def pe_configs(program: Program, lr_shift: int) -> list[PEConfig]:
    """The generation parameters of every PE, sized by the compiler's memory map."""
    out = []
    for pe in program.pes:
        p = pe.index
        incoming = [src for src, dst in program.links() if dst == p]
        bank0 = [q for q in pe.senders if "local" in program.link_sources(p, q)]
        out.append(PEConfig(
            lanes=program.lanes, fmt=program.fmt, lr_shift=lr_shift,
            weight_depth=max(1, pe.memory_words("weights")), grad_depth=max(1, pe.memory_words("grads")),
            local_depth=max(1, pe.memory_words("local")),
            recv_depths=tuple(max(1, pe.memory_words(bank)) for bank in pe.receive_banks),
            send_ports=len(bank0), extra_reads=tuple(_port_of(pe, m) for _, m in read_ports(program, p)),
            weight_writes=sum("weights" in program.link_targets(src, p) for src in incoming),
            grad_writes=sum("grads" in program.link_targets(src, p) for src in incoming),
            **{"max_dim": max(program.widths), **window_config(program, pe)}))
    return out


def window_config(program: Program, pe: PEProgram) -> dict[str, Any]:
    """The window geometries PE `pe` runs (conv2d, pooling, flatten) and a `max_dim` covering conv matrices."""
    from layerpipe.hdl._conv import matrix_shape

    windows = tuple(dict.fromkeys(s.window for e in pe.entries for s in e.steps if s.window is not None))
    if not windows and all(layer.kind == "linear" for layer in program.network.layers):
        return {}
    dims = [n for layer in program.network.layers if layer.has_weights for n in matrix_shape(layer)]
    return {"windows": windows, "max_dim": max(*program.widths, *dims)}


def rtl_sim_config(lanes: int, mode: str = "stash") -> SimConfig:
    """The simulator configuration under which `layerpipe.sim` times runs exactly like this hardware:
    the `rtl` interconnect (`Interconnect.rtl(lanes)`)."""
    return SimConfig.of(Interconnect.rtl(lanes), mode)


class Accelerator(wiring.Component):
    """N PEs running `program`; see the module docstring for the host ports."""

    def __init__(self, program: Program, lr_shift: int = 4) -> None:
        self.program = program
        self.lr_shift = lr_shift
        self.configs = pe_configs(program, lr_shift)
        self.iteration_bits = max(1, program.max_samples.bit_length())
        self.weight_addr_bits = max(c.weight_addr_bits for c in self.configs)
        self.vector_addr_bits = max(c.vector_addr_bits for c in self.configs)
        self.link_addr_bits = max(max(c.vector_addr_bits, c.weight_addr_bits, c.grad_addr_bits) for c in self.configs)
        word = self.configs[0].word
        super().__init__({
            "start": In(1),
            "samples_count": In(unsigned(self.iteration_bits)),
            # Test input: one bit per link (`program.links()` order) dropping its receiver's ready this cycle.
            "link_stall": In(max(1, len(program.links()))),
            "samples": In(stream.Signature(word)),
            "host_pe": In(range(max(2, program.num_pes))),
            "host_addr": In(unsigned(self.weight_addr_bits)),
            "host_w_en": In(1),
            "host_w_data": In(word),
            "host_r_data": Out(word),
            "busy": Out(1),
            "done": Out(1),
            "cycles": Out(32),
            "ops": Out(32),
            "error": Out(1),
            # Observation taps for the bench's passive monitors (unused by a host): per PE, an entry issued
            # (which entry of its program, which iteration); per link (`program.links()` order), a beat taken
            # and whether it ends a transfer.
            **{f"trace{p}_{field}": Out(shape) for p, pe in enumerate(program.pes)
               for field, shape in (("valid", 1), ("entry", range(max(2, len(pe.entries)))),
                                    ("iter", unsigned(self.iteration_bits)))},
            **{f"link{k}_{field}": Out(1) for k in range(len(program.links())) for field in ("beat", "last")},
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        prog = self.program
        pes, seqs = [], []
        for p, (pe_prog, cfg) in enumerate(zip(prog.pes, self.configs, strict=True)):
            pe = ProcessingElement(cfg)
            seq = Sequencer(pe_prog, cfg, self.iteration_bits)
            m.submodules[f"pe{p}"] = pe
            m.submodules[f"seq{p}"] = seq
            wiring.connect(m, seq.cmd, pe.cmd)
            m.d.comb += [seq.pe_done.eq(pe.done), seq.samples.eq(self.samples_count), seq.start.eq(self.start),
                         getattr(self, f"trace{p}_valid").eq(seq.trace_valid),
                         getattr(self, f"trace{p}_entry").eq(seq.trace_entry),
                         getattr(self, f"trace{p}_iter").eq(seq.trace_iter)]
            pes.append(pe)
            seqs.append(seq)

        # ---- links ----------------------------------------------------------------------------------
        senders: list[LinkSender] = []
        arrivals: dict[tuple[int, int], list] = {}
        bank0_port = {p: 0 for p in range(prog.num_pes)}
        extra_port = {p: 0 for p in range(prog.num_pes)}
        wwrite = {p: 0 for p in range(prog.num_pes)}
        gwrite = {p: 0 for p in range(prog.num_pes)}
        for p, q in prog.links():
            abits = self.link_addr_bits
            sender = LinkSender(prog, p, q, self.configs[p].word, self.iteration_bits, abits)
            receiver = LinkReceiver(prog, self.configs[q].word, abits)
            m.submodules[f"link{p}to{q}"] = sender
            m.submodules[f"recv{p}to{q}"] = receiver
            wiring.connect(m, sender.out, receiver.inp)
            k = len(senders)
            m.d.comb += [receiver.stall.eq(self.link_stall[k]),
                         getattr(self, f"link{k}_beat").eq(receiver.inp.valid & receiver.inp.ready),
                         getattr(self, f"link{k}_last").eq(receiver.inp.valid & receiver.inp.ready
                                                           & receiver.inp.payload.last)]
            m.d.comb += [sender.push_valid.eq(seqs[p].push_valid), sender.push_entry.eq(seqs[p].push_entry),
                         sender.push_iter.eq(seqs[p].push_iter), sender.samples.eq(self.samples_count)]
            for k, memory in enumerate(sender.sources):
                if memory == "local":
                    port = pes[p].send[bank0_port[p]]
                    bank0_port[p] += 1
                else:
                    port = pes[p].send[self.configs[p].send_ports + extra_port[p]]
                    extra_port[p] += 1
                m.d.comb += [port.addr.eq(sender.rd_addr), port.en.eq(sender.rd_en[k]),
                             sender.rd_data[k].eq(port.data)]
            targets = prog.link_targets(p, q)
            if f"from{p}" in targets:
                wport = pes[q].recv[prog.pes[q].bank(f"from{p}") - 1]
                m.d.comb += [wport.addr.eq(receiver.wr_addr), wport.data.eq(receiver.wr_data),
                             wport.en.eq(receiver.wr_en)]
            for memory, ports, used, enable in (("weights", "wwrite", wwrite, receiver.ww_en),
                                                 ("grads", "gwrite", gwrite, receiver.wg_en)):
                if memory in targets:
                    wport = getattr(pes[q], ports)[used[q]]
                    used[q] += 1
                    m.d.comb += [wport.addr.eq(receiver.wr_addr), wport.data.eq(receiver.wr_data),
                                 wport.en.eq(enable)]
            for k in range(len(prog.pes[q].counters)):
                arrivals.setdefault((q, k), []).append(receiver.arrived & (receiver.arrived_counter == k))
            senders.append(sender)
        for (q, k), pulses in arrivals.items():
            any_pulse = pulses[0]
            for pulse in pulses[1:]:
                any_pulse = any_pulse | pulse
            m.d.comb += seqs[q].arrived[k].eq(any_pulse)

        # ---- run control, then the sample loader: x(t) words then y(t) words, t = 0, 1, … ------------------
        running = Signal()
        misuse = self._sample_loader(m, pes, running)

        # ---- host access to the weight memories -------------------------------------------------------
        for p, pe in enumerate(pes):
            selected = self.host_pe == p
            m.d.comb += [pe.host.addr.eq(self.host_addr), pe.host.w_data.eq(self.host_w_data),
                         pe.host.w_en.eq(self.host_w_en & selected)]
        host_sel = Signal.like(self.host_pe)
        m.d.sync += host_sel.eq(self.host_pe)
        with m.Switch(host_sel):
            for p, pe in enumerate(pes):
                with m.Case(p):
                    m.d.comb += self.host_r_data.eq(pe.host.r_data)

        # ---- run control and counters -------------------------------------------------------------------
        idle = Signal()
        terms = [s.exhausted for s in seqs] + [pe.cmd.ready for pe in pes] + [~s.busy for s in senders]
        all_idle = terms[0]
        for term in terms[1:]:
            all_idle = all_idle & term
        m.d.comb += idle.eq(all_idle)
        with m.If(self.start):
            m.d.sync += [running.eq(1), self.done.eq(0), self.cycles.eq(0)]
        with m.Elif(running):
            with m.If(idle):
                m.d.sync += [running.eq(0), self.done.eq(1)]
            with m.Else():
                m.d.sync += self.cycles.eq(self.cycles + 1)
        total = seqs[0].issued
        for s in seqs[1:]:
            total = total + s.issued
        overflow = misuse
        for s in senders:
            overflow = overflow | s.overflow
        # Sticky until reset: a link queue overflow (never expected) or a host protocol violation.
        with m.If(overflow):
            m.d.sync += self.error.eq(1)
        m.d.comb += [self.busy.eq(running), self.ops.eq(total)]
        return m

    def _sample_loader(self, m: Module, pes: list[ProcessingElement], running: Signal) -> Signal:
        """x(t) words then y(t) words, t = 0, 1, …, written into the sample bank of every PE that holds them.

        Ready/valid: the loader is ready while no run is going and fewer than `max_samples` iterations are
        loaded; `start` rewinds it to t = 0 (the next run's samples). Returns the misuse pulse: a word offered
        during a run or past `max_samples` (the host protocol's `error`)."""
        prog = self.program
        lanes = prog.lanes
        batch = prog.network.batch  # x(t) and y(t) are the micro-batch's B vectors, one after another
        x_words = batch * -(-prog.widths[0] // lanes)
        y_words = batch * -(-prog.widths[-1] // lanes)
        t = Signal(range(prog.max_samples + 1))
        word = Signal(range(max(x_words, y_words) + 1))
        in_y = Signal()
        full = t == prog.max_samples
        m.d.comb += self.samples.ready.eq(~running & ~full)
        take = self.samples.valid & self.samples.ready
        misuse = Signal()
        m.d.comb += misuse.eq(self.samples.valid & ~self.samples.ready)
        for pe_prog, pe in zip(prog.pes, pes, strict=True):
            for which in ("x", "y"):
                buf = next((b for b in pe_prog.buffers if b.name == which and b.memory == "samples"), None)
                if buf is None:
                    continue
                port = pe.recv[pe_prog.bank("samples") - 1]
                selected = in_y if which == "y" else ~in_y
                with m.If(selected):
                    m.d.comb += [port.addr.eq(buf.base + mul_const(t, buf.slot_words) + word),
                                 port.data.eq(self.samples.payload), port.en.eq(take)]
        with m.If(self.start):
            m.d.sync += [t.eq(0), word.eq(0), in_y.eq(0)]
        with m.Elif(take):
            last = word == Mux(in_y, y_words - 1, x_words - 1)
            with m.If(last):
                m.d.sync += [word.eq(0), in_y.eq(~in_y)]
                with m.If(in_y):
                    m.d.sync += t.eq(t + 1)
            with m.Else():
                m.d.sync += word.eq(word + 1)
        return misuse
