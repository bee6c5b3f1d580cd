"""The top level of the accelerator: N PEs with their sequencers, the links between them, and the host side.

Host side: the narrow interface of `layerpipe.hdl._host` — one stream port (`stream_in`: samples and initial
weights; `stream_out`: weights read back) and a CSR bus (`csr_addr`, `csr_we`, `csr_wdata`, `csr_rdata`) for
start, clear, status, the cycle and command counters and T. 2 + 2·(stream_bits + 2) + CSR pins in all
(`host_port_bits`): 36 or 37 for the report's designs with the default 8-bit stream and 4-bit CSR data (the CSR
address takes 5 or 6 bits, by the widths of the design's registers).

Samples stream in during the run: x(t) and y(t) go to slot t mod D of the sample rings (D = the compiled
sample depth, a power of two), and the loader takes the words of iteration t only once iteration t − D is
released — when the entry holding G_1(t − D) ends, the last reader of x(t − D) and y(t − D) (A_L, E and
G of every layer come before it in the data flow; a transfer of x away ends before G_1 starts). The
sequencers stall an entry that reads a sample not yet delivered (`Sequencer.x_loaded` / `y_loaded`); while
the host keeps the rings full that never happens, and a run's cycle count is exactly the Python simulator's
under the `rtl` cost model and `rtl_sim_config`. `start` begins a run of T (SAMPLES) iterations with the
samples already in the rings (also a second one without reset: arrival counters, command and cycle counters
are cleared); the loader rewinds to t = 0 when the run ends (or on CLEAR), ready for the next run's samples.

`debug=True` adds the bench's observation taps and its stall injector (never in the synthesized top):
- `link_stall` one bit per link in `program.links()` order: drops that link's `ready` for the cycle;
- `cycles` the cycle counter, `trace{p}_*` (an entry issued: which entry, which iteration) per PE and
  `link{k}_beat` / `_last` per link, for the passive monitors; `activity` has those valids and beats as one
  vector (PE p at bit p, link k at bit P + k), so a monitor reads one signal in a cycle where nothing happens.
"""

from __future__ import annotations

from typing import Any

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, Value, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.hdl._host import HostConfig, HostInterface, host_widths, register_map
from layerpipe.hdl._link import LinkReceiver, LinkSender, slot_address
from layerpipe.hdl._pe import PEConfig, ProcessingElement
from layerpipe.hdl._program import PEProgram, Program
from layerpipe.hdl._sequencer import Sequencer
from layerpipe.interconnect import Interconnect
from layerpipe.sim import SimConfig

__all__ = ["Accelerator", "min_sample_depth", "pe_configs", "release_entry", "rtl_sim_config", "sample_depth"]


def _port_of(pe: PEProgram, memory: str) -> str:
    """A PE memory as a read-port target of `PEConfig.extra_reads`."""
    return memory if memory in ("weights", "grads") else f"bank{pe.bank(memory)}"


def read_ports(program: Program, p: int) -> list[tuple[int, str]]:
    """The sender read ports of PE p beyond bank 0's, as (destination PE, memory) in port order."""
    return [(q, m) for q in program.pes[p].senders for m in program.link_sources(p, q) if m != "local"]


def _written_regions(program: Program, p: int, q: int, memory: str) -> tuple[tuple[int, int], ...]:
    """The (first, end) word ranges of PE q's `memory` that the link p→q writes (its receiver's own memory)."""
    dst = program.pes[q]
    names = {s.dst for e in program.pes[p].entries for s in e.sends if s.dest == q}
    return tuple(sorted((b.base, b.base + b.words) for b in dst.buffers if b.memory == memory and b.name in names))


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
            weight_write_regions=tuple(_written_regions(program, src, p, "weights") for src in incoming
                                       if "weights" in program.link_targets(src, p)),
            grad_writes=sum("grads" in program.link_targets(src, p) for src in incoming),
            local_writes=sum("local" in program.link_targets(src, p) for src in incoming),
            sum_banks=any(step.x_sum for e in pe.entries for step in e.steps),
            strided=program.network.batch > 1 and any(b.view_of for b in pe.buffers),
            **{"max_dim": program.max_dim, **window_config(program, pe)}))
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

    def __init__(self, program: Program, lr_shift: int = 4, host: HostConfig | None = None,
                 debug: bool = False) -> None:
        self.program = program
        self.lr_shift = lr_shift
        self.host_config = host or HostConfig()
        self.debug = debug
        self.configs = pe_configs(program, lr_shift)
        self.iteration_bits = max(1, program.max_samples.bit_length())
        self.weight_addr_bits = max(c.weight_addr_bits for c in self.configs)
        self.vector_addr_bits = max(c.vector_addr_bits for c in self.configs)
        self.link_addr_bits = max(max(c.vector_addr_bits, c.weight_addr_bits, c.grad_addr_bits) for c in self.configs)
        self.sample_depth = sample_depth(program)
        self.host_args = {"pe_bits": max(1, (program.num_pes - 1).bit_length()), "addr_bits": self.weight_addr_bits,
                          "iteration_bits": self.iteration_bits, "max_samples": program.max_samples,
                          "depth": self.sample_depth}
        #: the CSR map (the HostInterface built at elaboration has the same)
        self.register_map = regs = register_map(self.host_config, host_widths(**self.host_args))
        self.beats_per_word = -(-Shape.cast(self.configs[0].word).width // self.host_config.stream_bits)
        ports: dict[str, wiring.Member] = {
            "stream_in": In(stream.Signature(self.host_config.stream_bits)),
            "stream_out": Out(stream.Signature(self.host_config.stream_bits)),
            "csr_addr": In(regs.addr_bits),
            "csr_we": In(1),
            "csr_wdata": In(self.host_config.csr_bits),
            "csr_rdata": Out(self.host_config.csr_bits),
        }
        if debug:
            ports.update({
                # Test input: one bit per link (`program.links()` order) dropping its receiver's ready this cycle.
                "link_stall": In(max(1, len(program.links()))),
                "cycles": Out(32),
                # Observation taps for the bench's passive monitors: per PE, an entry issued (which entry of its
                # program, which iteration); per link (`program.links()` order), a beat taken and whether it ends
                # a transfer.
                **{f"trace{p}_{field}": Out(shape) for p, pe in enumerate(program.pes)
                   for field, shape in (("valid", 1), ("entry", range(max(2, len(pe.entries)))),
                                        ("iter", unsigned(self.iteration_bits)))},
                **{f"link{k}_{field}": Out(1) for k in range(len(program.links())) for field in ("beat", "last")},
                "activity": Out(program.num_pes + len(program.links())),
            })
        super().__init__(ports)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        prog = self.program
        host = HostInterface(self.host_config, self.configs[0].word, **self.host_args)
        m.submodules.host = host
        for name in ("stream_in", "stream_out"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(host, name))
        m.d.comb += [host.csr_addr.eq(self.csr_addr), host.csr_we.eq(self.csr_we), host.csr_wdata.eq(self.csr_wdata),
                     self.csr_rdata.eq(host.csr_rdata)]
        samples_count = host.samples_count
        pes, seqs = [], []
        for p, (pe_prog, cfg) in enumerate(zip(prog.pes, self.configs, strict=True)):
            pe = ProcessingElement(cfg)
            seq = Sequencer(pe_prog, cfg, self.iteration_bits)
            m.submodules[f"pe{p}"] = pe
            m.submodules[f"seq{p}"] = seq
            wiring.connect(m, seq.cmd, pe.cmd)
            m.d.comb += [seq.pe_done.eq(pe.done), seq.samples.eq(samples_count), seq.start.eq(host.start)]
            if self.debug:
                m.d.comb += [getattr(self, f"trace{p}_valid").eq(seq.trace_valid),
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
        lwrite = {p: 0 for p in range(prog.num_pes)}
        for p, q in prog.links():
            abits = self.link_addr_bits
            sender = LinkSender(prog, p, q, self.configs[p].word, self.iteration_bits, abits)
            receiver = LinkReceiver(prog, self.configs[q].word, abits, local="local" in prog.link_targets(p, q))
            m.submodules[f"link{p}to{q}"] = sender
            m.submodules[f"recv{p}to{q}"] = receiver
            wiring.connect(m, sender.out, receiver.inp)
            k = len(senders)
            if self.debug:
                m.d.comb += [receiver.stall.eq(self.link_stall[k]),
                             getattr(self, f"link{k}_beat").eq(receiver.inp.valid & receiver.inp.ready),
                             getattr(self, f"link{k}_last").eq(receiver.inp.valid & receiver.inp.ready
                                                               & receiver.inp.payload.last)]
            m.d.comb += [sender.push_valid.eq(seqs[p].push_valid), sender.push_entry.eq(seqs[p].push_entry),
                         sender.push_iter.eq(seqs[p].push_iter), sender.samples.eq(samples_count)]
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
                                                 ("grads", "gwrite", gwrite, receiver.wg_en),
                                                 ("local", "lwrite", lwrite, getattr(receiver, "wl_en", None))):
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

        # ---- host access to the weight memories -------------------------------------------------------
        for p, pe in enumerate(pes):
            selected = host.pe == p
            m.d.comb += [pe.host.addr.eq(host.addr), pe.host.w_data.eq(host.w_data),
                         pe.host.w_en.eq(host.w_en & selected)]
        host_sel = Signal.like(host.pe)
        m.d.sync += host_sel.eq(host.pe)
        with m.Switch(host_sel):
            for p, pe in enumerate(pes):
                with m.Case(p):
                    m.d.comb += host.r_data.eq(pe.host.r_data)

        # ---- run control and counters -------------------------------------------------------------------
        running = Signal()
        done = Signal()
        cycles = Signal(32)
        error = Signal()
        idle = Signal()
        run_end = Signal()
        terms = [s.exhausted for s in seqs] + [pe.cmd.ready for pe in pes] + [~s.busy for s in senders]
        all_idle = terms[0]
        for term in terms[1:]:
            all_idle = all_idle & term
        m.d.comb += [idle.eq(all_idle), run_end.eq(running & idle & ~host.start)]
        with m.If(host.clear):
            m.d.sync += [done.eq(0), cycles.eq(0)]
        with m.If(host.start):
            m.d.sync += [running.eq(1), done.eq(0), cycles.eq(0)]
        with m.Elif(running):
            with m.If(idle):
                m.d.sync += [running.eq(0), done.eq(1)]
            with m.Else():
                m.d.sync += cycles.eq(cycles + 1)
        total = seqs[0].issued
        for s in seqs[1:]:
            total = total + s.issued
        overflow = host.misuse
        for s in senders:
            overflow = overflow | s.overflow
        # Sticky until reset or CLEAR: a link queue overflow (never expected) or a host protocol violation.
        with m.If(host.clear):
            m.d.sync += error.eq(0)
        with m.If(overflow):
            m.d.sync += error.eq(1)
        m.d.comb += [host.busy.eq(running), host.done.eq(done), host.cycles.eq(cycles), host.error.eq(error),
                     host.ops.eq(total)]
        if self.debug:
            links = len(prog.links())
            m.d.comb += [self.cycles.eq(cycles),
                         self.activity.eq(Cat(*(getattr(self, f"trace{p}_valid") for p in range(prog.num_pes)),
                                              *(getattr(self, f"link{k}_beat") for k in range(links))))]

        # ---- the sample loader: x(t) words then y(t) words into slot t mod D of the rings ---------------
        self._sample_loader(m, host, pes, seqs, run_end)
        return m

    def _sample_loader(self, m: Module, host: HostInterface, pes: list[ProcessingElement], seqs: list[Sequencer],
                       run_end: Value) -> None:
        """x(t) words then y(t) words, t = 0, 1, …, T − 1, each written into slot t mod D of the sample ring of the
        PE that holds it, once iteration t − D is released (see the module docstring); tells the sequencers
        how many iterations' x and y have arrived. Rewinds when the run ends and on CLEAR."""
        prog = self.program
        lanes = prog.lanes
        batch = prog.network.batch  # x(t) and y(t) are the micro-batch's B vectors, one after another
        x_words = batch * -(-prog.widths[0] // lanes)
        y_words = batch * -(-prog.widths[-1] // lanes)
        depth = self.sample_depth
        t = Signal(range(prog.max_samples + 1))  # iterations whose x and y are both in (y_loaded)
        x_loaded = Signal.like(t)
        released = Signal.like(t)
        word = Signal(range(max(x_words, y_words) + 1))
        in_y = Signal()
        m.d.comb += [host.sample_ready.eq((t < host.samples_count) & (t < released + depth)),
                     host.sample_over.eq(t >= host.samples_count), host.loaded.eq(t)]
        for seq in seqs:
            m.d.comb += [seq.x_loaded.eq(x_loaded), seq.y_loaded.eq(t)]
        take = host.sample_en
        for pe_prog, pe in zip(prog.pes, pes, strict=True):
            for which in ("x", "y"):
                buf = next((b for b in pe_prog.buffers if b.name == which and b.memory == "samples"), None)
                if buf is None:
                    continue
                port = pe.recv[pe_prog.bank("samples") - 1]
                selected = in_y if which == "y" else ~in_y
                with m.If(selected):
                    m.d.comb += [port.addr.eq(slot_address(buf, t) + word), port.data.eq(host.sample_data),
                                 port.en.eq(take)]
        # The entry holding G_1 ends last among the readers of an iteration's samples: it releases the slot.
        p_g1, e_g1 = release_entry(prog)
        release = seqs[p_g1].push_valid & (seqs[p_g1].push_entry == e_g1)
        with m.If(host.clear | run_end):
            m.d.sync += [t.eq(0), word.eq(0), in_y.eq(0), x_loaded.eq(0), released.eq(0)]
        with m.Else():
            with m.If(release):
                m.d.sync += released.eq(released + 1)
            with m.If(take):
                last = word == Mux(in_y, y_words - 1, x_words - 1)
                with m.If(last):
                    m.d.sync += [word.eq(0), in_y.eq(~in_y)]
                    with m.If(in_y):
                        m.d.sync += t.eq(t + 1)
                    with m.Else():
                        m.d.sync += x_loaded.eq(x_loaded + 1)
                with m.Else():
                    m.d.sync += word.eq(word + 1)


def release_entry(program: Program) -> tuple[int, int]:
    """(PE, entry index) of the entry holding G_1: when it ends for iteration t, x(t) and y(t) are no longer read."""
    for pe in program.pes:
        for e, entry in enumerate(pe.entries):
            if any(step.kind == "G" and step.layer == 1 for step in entry.steps):
                return pe.index, e
    raise ValueError("the program has no G_1")


def sample_depth(program: Program) -> int:
    """Slots of the sample rings (x's and y's are compiled alike)."""
    return min(b.depth for pe in program.pes for b in pe.buffers if b.memory == "samples")


def min_sample_depth(program: Program) -> int:
    """The smallest ring with which the in-order sequencers cannot deadlock: F_1(t + D) waits for x(t + D), which
    waits for G_1(t) to release slot t; with D > lag(G_1) − lag(F_1) every op G_1(t) depends on is in an earlier
    period than F_1(t + D), so every sequencer reaches them first."""
    lags = {(step.kind, step.layer): entry.lag for pe in program.pes for entry in pe.entries for step in entry.steps}
    return lags[("G", 1)] - lags[("F", 1)] + 1
