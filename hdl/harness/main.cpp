// Fast whole-accelerator simulation: a Verilator model driven by a stimulus file (issue 16 item 5).
//
// Built by layerpipe.hdl._harness (verilator --cc --exe -O3 --x-assign fast, no --public-flat-rw, no VPI):
// the only signals touched are the top-level ports, through the table `ports.h` that the Python side
// generates from the design's own port list. Expected values never enter this process: it replays the
// host operations the Python side wrote and reports what it read; Python compares.
//
// Usage: harness STIMULUS OUTPUT
// Stimulus, one command per line (values are hexadecimal, any width):
//   P name value          set an input port (takes effect at the next rising edge)
//   S n                   run n clock cycles
//   W name value max      run cycles until output `name` equals `value` (at most `max`; else exit 3)
//   R name                read a port: writes "R name value"
//   T0 / T1               start / stop the clocks: T1 writes "T wall_s cpu_s cycles" (cycles since T0; the
//                         process's CPU time as well, since on a shared machine wall time measures the load)
// Timing matches the cocotb bench: inputs change and outputs are read between clock edges (clk low).

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "Vtop.h"
#include "verilated.h"

struct Port {
    int width;
    bool input;
    void* ptr;  // CData/SData/IData/QData for width <= 64, else the 32-bit words of a VlWide
};

#include "ports.h"  // void bind_ports(Vtop*, std::unordered_map<std::string, Port>&)

static std::vector<uint32_t> parse_hex(const std::string& text, int width) {
    std::vector<uint32_t> words((width + 31) / 32, 0);
    int bit = 0;
    for (size_t i = text.size(); i-- > 0 && bit < 32 * static_cast<int>(words.size());) {
        char c = text[i];
        uint32_t nibble = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                        : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 0;
        words[bit / 32] |= nibble << (bit % 32);
        bit += 4;
    }
    if (width % 32) words.back() &= (1u << (width % 32)) - 1;  // a value wider than the port is truncated
    return words;
}

static void set_port(const Port& p, const std::vector<uint32_t>& w) {
    uint64_t low = w[0] | (w.size() > 1 ? static_cast<uint64_t>(w[1]) << 32 : 0);
    if (p.width <= 8) *static_cast<uint8_t*>(p.ptr) = static_cast<uint8_t>(low);
    else if (p.width <= 16) *static_cast<uint16_t*>(p.ptr) = static_cast<uint16_t>(low);
    else if (p.width <= 32) *static_cast<uint32_t*>(p.ptr) = static_cast<uint32_t>(low);
    else if (p.width <= 64) *static_cast<uint64_t*>(p.ptr) = low;
    else std::memcpy(p.ptr, w.data(), w.size() * sizeof(uint32_t));
}

static std::vector<uint32_t> get_port(const Port& p) {
    std::vector<uint32_t> w((p.width + 31) / 32, 0);
    uint64_t v = 0;
    if (p.width <= 8) v = *static_cast<uint8_t*>(p.ptr);
    else if (p.width <= 16) v = *static_cast<uint16_t*>(p.ptr);
    else if (p.width <= 32) v = *static_cast<uint32_t*>(p.ptr);
    else if (p.width <= 64) v = *static_cast<uint64_t*>(p.ptr);
    else { std::memcpy(w.data(), p.ptr, w.size() * sizeof(uint32_t)); return w; }
    w[0] = static_cast<uint32_t>(v);
    if (w.size() > 1) w[1] = static_cast<uint32_t>(v >> 32);
    return w;
}

static std::string to_hex(const std::vector<uint32_t>& w) {
    std::string out;
    char buf[9];
    for (size_t i = w.size(); i-- > 0;) {
        std::snprintf(buf, sizeof buf, "%08x", w[i]);
        out += buf;
    }
    size_t first = out.find_first_not_of('0');
    return first == std::string::npos ? "0" : out.substr(first);
}

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: harness STIMULUS OUTPUT\n";
        return 2;
    }
    auto context = std::make_unique<VerilatedContext>();
    auto top = std::make_unique<Vtop>(context.get());
    std::unordered_map<std::string, Port> ports;
    bind_ports(top.get(), ports);
    std::ifstream in(argv[1]);
    std::ofstream out(argv[2]);
    if (!in || !out) {
        std::cerr << "harness: cannot open " << (!in ? argv[1] : argv[2]) << "\n";
        return 2;
    }
    uint64_t cycle = 0, timer_cycle = 0;
    auto timer = std::chrono::steady_clock::now();
    std::clock_t cpu_timer = std::clock();
    top->clk = 0;
    top->eval();
    auto step = [&]() {  // one clock cycle, ending with clk low
        top->clk = 1;
        top->eval();
        top->clk = 0;
        top->eval();
        ++cycle;
    };
    auto port = [&](const std::string& name) -> const Port& {
        auto it = ports.find(name);
        if (it == ports.end()) {
            std::cerr << "harness: no port '" << name << "'\n";
            std::exit(2);
        }
        return it->second;
    };
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::string op, name, value;
        words >> op;
        if (op == "P") {
            words >> name >> value;
            const Port& p = port(name);
            set_port(p, parse_hex(value, p.width));
            top->eval();
        } else if (op == "S") {
            uint64_t n = 0;
            words >> n;
            for (uint64_t i = 0; i < n; ++i) step();
        } else if (op == "W") {
            uint64_t max = 0;
            words >> name >> value >> max;
            const Port& p = port(name);
            const std::vector<uint32_t> want = parse_hex(value, p.width);
            uint64_t n = 0;
            if (p.width == 1) {  // the common case (done): no allocation per cycle
                const uint8_t* bit = static_cast<const uint8_t*>(p.ptr);
                while (*bit != want[0] && n < max) { step(); ++n; }
            } else {
                while (get_port(p) != want && n < max) { step(); ++n; }
            }
            if (get_port(p) != want) {
                out << "E timeout " << name << " " << n << "\n";
                return 3;
            }
        } else if (op == "R") {
            words >> name;
            out << "R " << name << " " << to_hex(get_port(port(name))) << "\n";
        } else if (op == "T0") {
            timer = std::chrono::steady_clock::now();
            cpu_timer = std::clock();
            timer_cycle = cycle;
        } else if (op == "T1") {
            std::chrono::duration<double> s = std::chrono::steady_clock::now() - timer;
            double cpu = static_cast<double>(std::clock() - cpu_timer) / CLOCKS_PER_SEC;
            char buf[96];
            std::snprintf(buf, sizeof buf, "%.6f %.6f", s.count(), cpu);
            out << "T " << buf << " " << (cycle - timer_cycle) << "\n";
        } else if (!op.empty() && op[0] != '#') {
            std::cerr << "harness: unknown command '" << op << "'\n";
            return 2;
        }
    }
    top->final();
    out << "C " << cycle << "\n";
    return 0;
}
