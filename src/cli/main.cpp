#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "cli/vllm_flags.h"
#include "core/error.h"

int main(int argc, char** argv) {
  glms::cli::ensure_openmp_wait_policy(argv);
  CLI::App app{"glmserve: an inference server for the GLM-5 family (glm_moe_dsa)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "glmserve 0.1.0");
  try {
    // Inside the try: a CLI11 that refuses an option definition says so instead of aborting.
    glms::cli::add_generate_command(app);
    glms::cli::add_tokenize_command(app);
    glms::cli::add_inspect_command(app);
    glms::cli::add_plan_command(app);
    glms::cli::add_quantize_command(app);
    glms::cli::add_serve_command(app);
    glms::cli::add_bench_command(app);
    glms::cli::add_bench_step_command(app);
    glms::cli::add_bench_structured_command(app);
    // vLLM's spellings of the subcommand's flags in glmserve's.
    const CLI::App* command = nullptr;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (argc > 1 && sub->get_name() == argv[1]) command = sub;
    const auto takes = [command](const std::string& name) {
      return command != nullptr && command->get_option_no_throw(name) != nullptr;
    };
    std::vector<std::string> args =
        glms::cli::normalize_vllm_arguments(std::vector<std::string>(argv, argv + argc), takes);
    app.name(args.front());
    args.erase(args.begin());
    std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
    app.parse(args);
  } catch (const CLI::ExtrasError& e) {
    app.exit(e);
    std::fprintf(stderr,
                 "`glmserve SUBCOMMAND --help` lists a subcommand's flags; vLLM's and SGLang's flags that serve takes "
                 "are in docs/operations.md (\"Coming from vLLM\")\n");
    return 1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help and --version: 0; a refused command line: 1, as glmserve's errors
  } catch (const glms::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
