// The web UI's page (src/server/web/dashboard.html), embedded at build time: the dashboard and
// chat playground glmserve serve answers at / and /dashboard.
#pragma once

#include <string_view>

namespace glms::server {

std::string_view dashboard_html();

}  // namespace glms::server
