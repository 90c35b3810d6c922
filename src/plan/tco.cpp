#include "plan/tco.h"

#include <string>

#include "core/error.h"

namespace glms::plan {

namespace {
constexpr double kHoursPerYear = 24 * 365;
constexpr double kHoursPerMonth = kHoursPerYear / 12;
}  // namespace

TcoBreakdown tco_per_gpu_hour(const TcoInputs& in, double board_watts) {
  if (in.gpu_price < 0 || in.host_price_per_gpu < 0 || in.usd_per_kwh < 0 || in.usd_per_kw_month < 0 ||
      in.maintenance_per_year < 0 || in.host_watts_per_gpu < 0)
    fail("TCO: prices, watts and rates cannot be negative");
  if (!(in.years > 0)) fail("TCO: the hardware must be written off over more than 0 years");
  if (!(in.pue >= 1)) fail("TCO: a PUE is facility power over IT power, at least 1 (got " + std::to_string(in.pue) + ")");
  if (!(in.power_share > 0 && in.power_share <= 1)) fail("TCO: the average power share must be in (0, 1]");
  const double capex = in.gpu_price + in.host_price_per_gpu;
  TcoBreakdown t;
  t.it_kw = (board_watts + in.host_watts_per_gpu) * in.power_share / 1e3;
  t.hardware = capex / (in.years * kHoursPerYear);
  t.power = t.it_kw * in.usd_per_kwh;
  t.cooling = t.power * (in.pue - 1);
  t.space = t.it_kw * in.usd_per_kw_month / kHoursPerMonth;
  t.maintenance = capex * in.maintenance_per_year / kHoursPerYear;
  return t;
}

}  // namespace glms::plan
