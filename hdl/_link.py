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
  receiver writes it in that cycle; on the last beat it also bumps the destination's arrival counter, which
  the destination sequencer sees in cycle D + k + 2. The next transfer's reads start at D + k + 1: the link
  is busy exactly k cycles per transfer. Hence `LINK_LATENCY` = 2.

A transfer reads any memory of its source PE (bank 0, a receive bank it passes on, the weight ring, the
gradients) and writes the destination's receive bank, weight memory or gradient memory.
Links have ready/valid back-pressure: a receiver that is not ready holds the sender's beat (the sender's read
pipeline waits with it). In the design the receiver is always ready (it writes memory ports only it uses);
the bench's stall injector drops `ready` at random (`stall`), which delays arrivals but changes no value:
ring and queue depths come from happens-before, not from the timing. Beats carry their destination
(memory, address), so the receiver has no state.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from layerpipe.hdl._compiler import Buffer, Program, Send
from layerpipe.hdl._datapath import mul_const
from layerpipe.interconnect import RTL_LINK_LATENCY

__all__ = ["LINK_LATENCY", "MEM_BANK", "MEM_GRADS", "MEM_WEIGHTS", "LinkReceiver", "LinkSender", "beat_layout"]

#: Cycles between a transfer's last beat leaving the link (model time) and the consumer being able to start.
LINK_LATENCY = RTL_LINK_LATENCY
#: Where a beat goes on the destination PE.
MEM_BANK, MEM_WEIGHTS, MEM_GRADS = 0, 1, 2


def beat_layout(word: data.ArrayLayout, address_bits: int, counter_bits: int) -> data.StructLayout:
    """One link beat: a memory word and where it goes; `last` marks a transfer's final beat."""
    return data.StructLayout({"data": word, "addr": unsigned(address_bits), "last": 1,
                              "counter": unsigned(max(1, counter_bits)), "mem": unsigned(2)})


def slot_address(buffer: Buffer, index: Value) -> Value | int:
    """base + (index mod depth) · slot_words for a power-of-two depth (a constant multiply: shifts and adds)."""
    if buffer.depth == 1:
        return buffer.base
    return buffer.base + mul_const(index[: (buffer.depth - 1).bit_length()], buffer.slot_words)


def _counter_bits(program: Program) -> int:
    return max(1, max(len(pe.counters) for pe in program.pes) - 1).bit_length()


def _target(memory: str) -> int:
    return {"weights": MEM_WEIGHTS, "grads": MEM_GRADS}.get(memory, MEM_BANK)


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

        # ---- current item: the sends still to do (lowest first), which beat ----------------------------
        busy = Signal()
        cur_entry = Signal.like(q_entry[0])
        cur_iter = Signal(ibits)
        remaining = Signal(width)
        send_idx = Signal(range(max(2, width)))
        for k in reversed(range(width)):  # priority encoder: the last assignment (lowest k) wins
            with m.If(remaining[k]):
                m.d.comb += send_idx.eq(k)
        beat = Signal(range(max(b.slot_words for b in src_pe.buffers) + 1))
        src_addr = Signal(abits)
        dst_addr = Signal(abits)
        beats = Signal.like(beat)
        counter = Signal.like(self.out.payload.counter)
        target = Signal(2)
        source = Signal(range(max(2, len(self.sources))))
        last_send = Signal()
        with m.Switch(cur_entry):
            for e, sends in enumerate(self.entry_sends):
                if not sends:
                    continue
                with m.Case(e), m.Switch(send_idx):
                    for k, s in enumerate(sends):
                        with m.Case(k):
                            src_buf = src_pe.buffer(s.src)
                            index = Signal(signed(ibits + 2), name=f"src_index{e}_{k}")
                            m.d.comb += index.eq(cur_iter + s.src_offset)
                            clamped = (Mux(index < 0, 0, index) if s.src_offset < 0 else index)[:ibits + 1]
                            m.d.comb += [
                                src_addr.eq(slot_address(src_buf, clamped)),
                                beats.eq(src_buf.slot_words),
                                counter.eq(s.counter),
                                source.eq(self.sources.index(src_buf.memory)),
                                last_send.eq((remaining >> (k + 1)) == 0),
                            ]
                            dst_buf = dst_pe.buffer(s.dst)
                            m.d.comb += [dst_addr.eq(slot_address(dst_buf, cur_iter + s.dst_offset)),
                                         target.eq(_target(dst_buf.memory))]
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
            m.d.comb += self.rd_addr.eq(src_addr + beat)
            for k in range(len(self.sources)):
                m.d.comb += self.rd_en[k].eq(source == k)
            with m.If(last_beat):
                m.d.sync += [beat.eq(0), remaining.eq(remaining & ~(Const(1, width) << send_idx)[:width])]
            with m.Else():
                m.d.sync += beat.eq(beat + 1)
        with m.If(finishing & advance):
            m.d.sync += busy.eq(0)
        with m.If(load):
            m.d.sync += [busy.eq(1), cur_entry.eq(q_entry[head]), cur_iter.eq(q_iter[head]),
                         remaining.eq(q_mask[head]), beat.eq(0), head.eq(head + 1)]
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
            m.d.sync += [valid_r.eq(busy), addr_r.eq(dst_addr + beat), last_r.eq(last_beat & busy),
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

    Write ports: `wr_*` (the receive bank of this link), `ww_*` (weight memory), `wg_*` (gradient memory).
    `arrived` pulses with `arrived_counter` in the cycle of the last write, so the destination sequencer sees
    the incremented counter one cycle later, when the data is readable.
    """

    def __init__(self, program: Program, word: data.ArrayLayout, address_bits: int) -> None:
        abits = address_bits
        super().__init__({
            "inp": In(stream.Signature(beat_layout(word, abits, _counter_bits(program)))),
            "stall": In(1),
            "wr_addr": Out(unsigned(abits)),
            "wr_data": Out(word),
            "wr_en": Out(1),
            "ww_en": Out(1),
            "wg_en": Out(1),
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
            self.wr_en.eq(taken & (beat.mem == MEM_BANK)),
            self.ww_en.eq(taken & (beat.mem == MEM_WEIGHTS)),
            self.wg_en.eq(taken & (beat.mem == MEM_GRADS)),
            self.wr_addr.eq(beat.addr),
            self.wr_data.eq(beat.data),
            self.arrived.eq(taken & beat.last),
            self.arrived_counter.eq(beat.counter),
        ]
        return m
