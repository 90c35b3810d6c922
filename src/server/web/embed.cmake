# Writes OUTPUT, a C++ source defining glms::server::dashboard_html() as the bytes of INPUT
# (run at build time by src/server/CMakeLists.txt, so the page is rebuilt when it changes).
file(READ ${INPUT} page)
string(FIND "${page}" ")glmsweb\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string terminator )glmsweb\"")
endif()
file(WRITE ${OUTPUT} "// Generated from src/server/web/dashboard.html by embed.cmake; do not edit.\n"
  "#include \"server/web_ui.h\"\n\nnamespace glms::server {\n\n"
  "std::string_view dashboard_html() {\n  static constexpr std::string_view page = R\"glmsweb(${page})glmsweb\";\n"
  "  return page;\n}\n\n}  // namespace glms::server\n")
