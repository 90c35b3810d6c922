// The cost of owning the GPUs instead of renting them (glmserve plan --gpu-price): the hardware
// written off over its years, the power its boards and hosts draw, the cooling and power
// distribution around them (the facility's PUE), the floor space priced per kW of IT load, and
// maintenance as a share of the hardware a year, each per GPU-hour. docs/planning.md gives the
// formulas; every input is an assumption the report repeats, so an operator can put in their own.
#pragma once

namespace glms::plan {

struct TcoInputs {
  double gpu_price = 0;             // USD per GPU; 0: no TCO (the rental price is the cost)
  double host_price_per_gpu = 0;    // USD of the server around each GPU (CPUs, memory, NICs, chassis)
  double years = 4;                 // the hardware is written off over this many years
  double usd_per_kwh = 0.10;        // electricity
  double pue = 1.3;                 // facility power over IT power: cooling and power distribution
  double host_watts_per_gpu = 0;    // the host's draw per GPU, beside the board power
  double power_share = 1.0;         // average draw as a share of board + host power
  double usd_per_kw_month = 0;      // space: colocation or floor space per kW of IT load a month
  double maintenance_per_year = 0;  // support and repairs, a share of the hardware price a year
};

// USD per GPU-hour, by part.
struct TcoBreakdown {
  double hardware = 0, power = 0, cooling = 0, space = 0, maintenance = 0;
  double it_kw = 0;  // IT load per GPU at the average draw (board + host), kW
  double total() const { return hardware + power + cooling + space + maintenance; }
};

// Throws glms::Error for inputs outside their sense (years <= 0, PUE < 1, negative prices).
TcoBreakdown tco_per_gpu_hour(const TcoInputs& in, double board_watts);

}  // namespace glms::plan
