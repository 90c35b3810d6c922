// Each glmserve subcommand lives in its own file and registers itself on the CLI11 app.
// A command's callback throws glms::Error for user errors; main() prints them and exits 1.
#pragma once

namespace CLI { class App; }

namespace glms::cli {

// Re-executes the process with OMP_WAIT_POLICY=passive unless the environment sets a policy.
void ensure_openmp_wait_policy(char** argv);

void add_generate_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_step_command(CLI::App& app);
void add_bench_structured_command(CLI::App& app);

}  // namespace glms::cli
