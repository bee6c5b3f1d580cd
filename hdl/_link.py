"""Stream links between PEs: a sender per ordered PE pair that carries data, and its receiver.

Timing is the simulator's `links` interconnect (`layerpipe.interconnect.Interconnect.rtl(lanes)`) with
`words_per_cycle = lanes` and `latency = LINK_LATENCY` (= `RTL_LINK_LATENCY`, the one definition the
schedulers use):

- in the last busy cycle of an entry's last step (the PE's `done`, cycle e − 1 when the op ends at e) the
  sequencer pushes (entry, iteration) into the sender of every link the entry sends on; the sender moves
  that entry's transfers on this link one after another, in the order the compiler listed them (consumer
  program order), so the queue order is the model's (producer end, consumer order). A transfer whose
  consumer iteration t + delay is ≥ T does not exist in the model: it is masked out when pushed, and an item
  with nothing left to send is not queued;
- a transfer of w elements is k = ⌈w/lanes⌉ beats on consecutive cycles. With D = max(e, the cycle the link
  became free) the model's departure, the sender loads the transfer in cycle D, issues the memory read of
  beat i in cycle D + 1 + i, the word is on the link in cycle D + 2 + i (the memory's read latency) and the
  receiver takes it in that cycle (its write, registered, lands in the next); on the last beat it also bumps
  the destination's arrival counter, which the destination sequencer sees in cycle D + k + 2. The next
  transfer's reads start at D + k + 1: the link is busy exactly k cycles per transfer. Hence
  `LINK_LATENCY` = 2. For the FPGA's clock a beat's read address comes from a register (the send in
  progress is held in registers, its slot arithmetic done when it is loaded) and the receiver's write is
  registered: neither changes these cycles.

A transfer reads any memory of its source PE (bank 0, a receive bank it passes on, the weight ring, the
gradients) and writes the destination's receive bank, weight memory or gradient memory.
Links have ready/valid back-pressure: a receiver that is not ready holds the sender's beat (the sender's read
pipeline waits with it). In the design the receiver is always ready (it writes memory ports only it uses);
the bench's stall injector drops `ready` at random (`stall`), which delays arrivals but changes no value:
ring and queue depths come from happens-before, not from the timing. Beats carry their destination
(memory, address), so the receiver has no state.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.hdl._datapath import iteration_sum_shape, mul_const
from layerpipe.hdl._program import Buffer, Program, Send
from layerpipe.interconnect import RTL_LINK_LATENCY

__all__ = ["LINK_LATENCY", "MEM_BANK", "MEM_GRADS", "MEM_WEIGHTS", "LinkReceiver", "LinkSender", "beat_layout"]

#: Cycles between a transfer's last beat leaving the link (model time) and the consumer being able to start.
LINK_LATENCY = RTL_LINK_LATENCY
#: Where a beat goes on the destination PE: its receive bank, the weight or gradient memory, or bank 0 (a split
#: layer's part into the concatenation its consumer reads there, next to the parts computed locally).
MEM_BANK, MEM_WEIGHTS, MEM_GRADS, MEM_LOCAL = 0, 1, 2, 3


def beat_layout(word: data.ArrayLayout, address_bits: int, counter_bits: int) -> data.StructLayout:
    """One link beat: a memory word and where it goes; `last` marks a transfer's final beat."""
    return data.StructLayout({"data": word, "addr": unsigned(address_bits), "last": 1,
                              "counter": unsigned(max(1, counter_bits)), "mem": unsigned(2)})


def slot_address(buffer: Buffer, index: Value) -> Value | int:
    """base + (index mod depth) · slot_words for a power-of-two depth (a constant multiply: shifts and adds)."""
    if buffer.depth == 1:
        return buffer.base
    return buffer.base + mul_const(index[: (buffer.depth - 1).bit_length()], buffer.pitch)


def _counter_bits(program: Program) -> int:
    return max(1, max(len(pe.counters) for pe in program.pes) - 1).bit_length()


def _target(memory: str) -> int:
    return {"weights": MEM_WEIGHTS, "grads": MEM_GRADS, "local": MEM_LOCAL}.get(memory, MEM_BANK)


class LinkSender(wiring.Component):
    """Moves the transfers of PE `src` to PE `dest`, queued per producer op in producer-end order.

    Ports: `push_*` from the source sequencer (an entry ended: entry index, iteration), `samples` (T, for the
    masks), one read port per source memory (`rd_addr` shared, `rd_en[k]`, `rd_data[k]`; one cycle latency;
    memory k is `program.link_sources(src, dest)[k]`), and the link stream `out`. `overflow` is a sticky
    flag: the queue was full (the compiler sized it from the lags, so it should never be set).
    """

    def __init__(self, program: Program, src: int, dest: int, word: data.ArrayLayout, iteration_bits: int,
                 address_bits: int) -> None:
        self.program = program
        self.src = src
        self.dest = dest
        self.iteration_bits = iteration_bits
        pe = program.pes[src]
        self.entry_sends: list[list[Send]] = [[s for s in e.sends if s.dest == dest] for e in pe.entries]
        self.sources = program.link_sources(src, dest)
        self.queue_depth = pe.queue_depth(dest)
        self.address_bits = abits = address_bits
        super().__init__({
            "push_valid": In(1),
            "push_entry": In(range(max(2, len(pe.entries)))),
            "push_iter": In(unsigned(iteration_bits)),
            "samples": In(unsigned(iteration_bits)),
            "rd_addr": Out(unsigned(abits)),
            "rd_en": Out(1).array(len(self.sources)),
            "rd_data": In(word).array(len(self.sources)),
            "out": Out(stream.Signature(beat_layout(word, abits, _counter_bits(program)))),
            "busy": Out(1),
            "overflow": Out(1),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        src_pe, dst_pe = self.program.pes[self.src], self.program.pes[self.dest]
        entries = len(self.entry_sends)
        qd = self.queue_depth
        ibits = self.iteration_bits
        abits = self.address_bits
        width = max(1, max((len(s) for s in self.entry_sends), default=1))

        # ---- queue of (entry, iteration, sends that exist), one item per producer op ----------------------
        q_entry = Array(Signal(range(max(2, entries)), name=f"q_entry{i}") for i in range(qd))
        q_iter = Array(Signal(ibits, name=f"q_iter{i}") for i in range(qd))
        q_mask = Array(Signal(width, name=f"q_mask{i}") for i in range(qd))
        head = Signal(range(qd))
        tail = Signal(range(qd))
        count = Signal(range(qd + 1))
        push_mask = Signal(width)
        with m.Switch(self.push_entry):
            for e, sends in enumerate(self.entry_sends):
                if sends:
                    with m.Case(e):
                        # A send exists when its consumer's iteration t + delay is < T (the model's op list).
                        m.d.comb += push_mask.eq(Cat(self.push_iter + s.delay < self.samples for s in sends))
        push = Signal()
        m.d.comb += push.eq(self.push_valid & (push_mask != 0))

        # ---- current item and the send in progress ------------------------------------------------------
        # The send in progress is held in registers (its next read address, its next destination address, the
        # beat, its length and tags), loaded from the queue's head when an item starts and from the current
        # item's next send when a send ends: so a beat's read address comes straight from a register, and the
        # slot arithmetic (iteration → ring slot → address) is a register-to-register path of its own.
        busy = Signal()
        cur_entry = Signal.like(q_entry[0])
        cur_iter = Signal(ibits)
        rest = Signal(width)  # the item's sends after the one in progress
        beat = Signal(range(max(b.slot_words for b in src_pe.buffers) + 1))
        beats = Signal.like(beat)
        # A micro-batch's vectors inside a split layer's concatenation (`hdl/_split.py`): B runs of `run` words,
        # `stride` apart, on either end; the pointer jumps at the end of each run. Built only when a send has one.
        batch = self.program.network.batch
        runs = [(src_pe.buffer(snd.src), dst_pe.buffer(snd.dst)) for sends in self.entry_sends for snd in sends]
        strided = batch > 1 and any(b.view_of for pair in runs for b in pair)
        run_bits = max(1, max((b.slot_words for pair in runs for b in pair), default=1).bit_length())
        if strided:  # (only then: the other designs' Verilog stays as it was, names included)
            src_run, dst_run, src_k, dst_k = (Signal(run_bits, name=n) for n in ("src_run", "dst_run", "src_k",
                                                                                 "dst_k"))
            src_jump, dst_jump = Signal(abits, name="src_jump"), Signal(abits, name="dst_jump")
        rd_ptr = Signal(abits)
        dst_ptr = Signal(abits)
        counter = Signal.like(self.out.payload.counter)
        target = Signal(2)
        source = Signal(range(max(2, len(self.sources))))
        last_send = Signal()

        def send_info(entry: Value, iteration: Value, mask: Value, tag: str) -> dict[str, Signal]:
            """The lowest send of `mask` of item (entry, iteration): its first addresses, length and tags."""
            info = {"src": Signal(abits, name=f"{tag}_src"), "dst": Signal(abits, name=f"{tag}_dst"),
                    "beats": Signal.like(beats, name=f"{tag}_beats"),
                    "counter": Signal.like(counter, name=f"{tag}_counter"), "target": Signal(2, name=f"{tag}_target"),
                    "source": Signal.like(source, name=f"{tag}_source"), "rest": Signal(width, name=f"{tag}_rest")}
            if strided:
                info.update({f"{end}_{what}": Signal(run_bits if what == "run" else abits, name=f"{tag}_{end}_{what}")
                             for end in ("src", "dst") for what in ("run", "jump")})
            index = Signal(range(max(2, width)), name=f"{tag}_send")
            for k in reversed(range(width)):  # priority encoder: the last assignment (lowest k) wins
                with m.If(mask[k]):
                    m.d.comb += index.eq(k)
            m.d.comb += info["rest"].eq(mask & ~(Const(1, width) << index)[:width])
            with m.Switch(entry):
                for e, sends in enumerate(self.entry_sends):
                    if not sends:
                        continue
                    with m.Case(e), m.Switch(index):
                        for k, snd in enumerate(sends):
                            with m.Case(k):
                                src_buf = src_pe.buffer(snd.src)
                                shifted = Signal(iteration_sum_shape(ibits, snd.src_offset, snd.src_offset),
                                                 name=f"{tag}_src_index{e}_{k}")
                                m.d.comb += shifted.eq(iteration + snd.src_offset)
                                clamped = (Mux(shifted < 0, 0, shifted) if snd.src_offset < 0
                                           else shifted)[:len(shifted) - 1]
                                dst_buf = dst_pe.buffer(snd.dst)
                                m.d.comb += [
                                    info["src"].eq(slot_address(src_buf, clamped)),
                                    info["dst"].eq(slot_address(dst_buf, iteration + snd.dst_offset)),
                                    info["beats"].eq(src_buf.slot_words),
                                    info["counter"].eq(snd.counter),
                                    info["target"].eq(_target(dst_buf.memory)),
                                    info["source"].eq(self.sources.index(src_buf.memory)),
                                ]
                                if strided:  # run length and the jump to the next sample's run (+1 of the beat)
                                    m.d.comb += [info["src_run"].eq(src_buf.slot_words // batch),
                                                 info["src_jump"].eq(src_buf.pitch // batch
                                                                     - src_buf.slot_words // batch + 1),
                                                 info["dst_run"].eq(dst_buf.slot_words // batch),
                                                 info["dst_jump"].eq(dst_buf.pitch // batch
                                                                     - dst_buf.slot_words // batch + 1)]
            return info

        def start_send(info: dict[str, Signal]) -> list:
            extra = [src_run.eq(info["src_run"]), dst_run.eq(info["dst_run"]), src_jump.eq(info["src_jump"]),
                     dst_jump.eq(info["dst_jump"]), src_k.eq(0), dst_k.eq(0)] if strided else []
            return [rd_ptr.eq(info["src"]), dst_ptr.eq(info["dst"]), beats.eq(info["beats"]), beat.eq(0),
                    counter.eq(info["counter"]), target.eq(info["target"]), source.eq(info["source"]),
                    rest.eq(info["rest"]), last_send.eq(info["rest"] == 0), *extra]

        head_info = send_info(q_entry[head], q_iter[head], q_mask[head], "head")
        next_info = send_info(cur_entry, cur_iter, rest, "next")
        last_beat = Signal()
        m.d.comb += last_beat.eq(beat == beats - 1)
        finishing = Signal()
        m.d.comb += finishing.eq(busy & last_beat & last_send)
        # Back-pressure: the beat on the link waits while the receiver is not ready; the read pipeline holds
        # (no new read, so the memory's output keeps the waiting beat's word).
        valid_r = Signal()
        advance = Signal()
        m.d.comb += advance.eq(~valid_r | self.out.ready)
        load = Signal()
        m.d.comb += load.eq(advance & (~busy | finishing) & (count != 0))

        with m.If(busy & advance):
            m.d.comb += self.rd_addr.eq(rd_ptr)
            for k in range(len(self.sources)):
                m.d.comb += self.rd_en[k].eq(source == k)
            with m.If(last_beat):
                m.d.sync += start_send(next_info)  # the item's next send (when there is one)
            with m.Else():
                if strided:
                    src_end, dst_end = src_k == src_run - 1, dst_k == dst_run - 1
                    m.d.sync += [beat.eq(beat + 1), rd_ptr.eq(rd_ptr + Mux(src_end, src_jump, 1)),
                                 dst_ptr.eq(dst_ptr + Mux(dst_end, dst_jump, 1)),
                                 src_k.eq(Mux(src_end, 0, src_k + 1)), dst_k.eq(Mux(dst_end, 0, dst_k + 1))]
                else:
                    m.d.sync += [beat.eq(beat + 1), rd_ptr.eq(rd_ptr + 1), dst_ptr.eq(dst_ptr + 1)]
        with m.If(finishing & advance):
            m.d.sync += busy.eq(0)
        with m.If(load):
            m.d.sync += [busy.eq(1), cur_entry.eq(q_entry[head]), cur_iter.eq(q_iter[head]), head.eq(head + 1),
                         *start_send(head_info)]
        with m.If(push):
            m.d.sync += [q_entry[tail].eq(self.push_entry), q_iter[tail].eq(self.push_iter),
                         q_mask[tail].eq(push_mask), tail.eq(tail + 1)]
        m.d.sync += count.eq(count + push - load)
        with m.If(push & ~load & (count == qd)):
            m.d.sync += self.overflow.eq(1)

        # ---- the beat leaves one cycle after its read (the memory's read latency) ---------------------
        addr_r = Signal(abits)
        last_r = Signal()
        counter_r = Signal.like(counter)
        target_r = Signal(2)
        source_r = Signal.like(source)
        with m.If(advance):
            m.d.sync += [valid_r.eq(busy), addr_r.eq(dst_ptr), last_r.eq(last_beat & busy),
                         counter_r.eq(counter), target_r.eq(target), source_r.eq(source)]
        with m.Switch(source_r):
            for k in range(len(self.sources)):
                with m.Case(k):
                    m.d.comb += self.out.payload.data.eq(self.rd_data[k])
        m.d.comb += [
            self.out.valid.eq(valid_r),
            self.out.payload.addr.eq(addr_r),
            self.out.payload.last.eq(last_r),
            self.out.payload.counter.eq(counter_r),
            self.out.payload.mem.eq(target_r),
            self.busy.eq(busy | valid_r | (count != 0)),
        ]
        return m


class LinkReceiver(wiring.Component):
    """Writes each beat into the destination PE's memory it names; the last beat of a transfer bumps a counter.

    `stall` (a test input: the bench's random stall injector; 0 in a real system) drops `ready`, so the sender
    holds its beat: the link then takes longer, the data and the order stay the same.

    Write ports: `wr_*` (the receive bank of this link), `ww_*` (weight memory), `wg_*` (gradient memory),
    `wl_*` (bank 0: parts of a concatenation).
    `arrived` pulses with `arrived_counter` in the cycle the last beat is taken; the write ports are registered
    (the write lands a cycle later), so the destination sequencer sees the incremented counter in the cycle the
    last word is written, and its PE reads it cycles later.
    """

    def __init__(self, program: Program, word: data.ArrayLayout, address_bits: int, local: bool = False) -> None:
        abits = address_bits
        self.local = local  #: the link writes bank 0 too (a split layer's parts): the `wl_*` port exists
        super().__init__({
            "inp": In(stream.Signature(beat_layout(word, abits, _counter_bits(program)))),
            "stall": In(1),
            "wr_addr": Out(unsigned(abits)),
            "wr_data": Out(word),
            "wr_en": Out(1),
            "ww_en": Out(1),
            "wg_en": Out(1),
            **({"wl_en": Out(1)} if local else {}),
            "arrived": Out(1),
            "arrived_counter": Out(unsigned(max(1, _counter_bits(program)))),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        beat = self.inp.payload
        taken = Signal()
        m.d.comb += [
            self.inp.ready.eq(~self.stall),
            taken.eq(self.inp.valid & self.inp.ready),
            self.arrived.eq(taken & beat.last),
            self.arrived_counter.eq(beat.counter),
        ]
        # The write is registered (the word comes straight from the sender's memory, across the chip): it lands
        # the cycle after the beat is taken, still before any reader can see the arrival (the destination
        # sequencer sees the counter a cycle later and its PE reads at least two cycles after accepting).
        written = Signal()
        mem = Signal.like(beat.mem)
        m.d.sync += [written.eq(taken), mem.eq(beat.mem), self.wr_addr.eq(beat.addr), self.wr_data.eq(beat.data)]
        m.d.comb += [
            self.wr_en.eq(written & (mem == MEM_BANK)),
            self.ww_en.eq(written & (mem == MEM_WEIGHTS)),
            self.wg_en.eq(written & (mem == MEM_GRADS)),
        ]
        if self.local:
            m.d.comb += self.wl_en.eq(written & (mem == MEM_LOCAL))
        return m
