#include "io/hf_cache.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <vector>

#include "core/error.h"

namespace glms::io {

namespace fs = std::filesystem;

namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

bool repo_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

bool repo_name_part(const std::string& part) {
  if (part.empty() || part.size() > 96 || part[0] == '.' || part[0] == '-') return false;
  for (char c : part)
    if (!repo_name_char(c)) return false;
  return true;
}

std::string trimmed_first_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  const size_t end = line.find_last_not_of(" \t\r\n");
  return end == std::string::npos ? "" : line.substr(0, end + 1);
}

// The names a user may pass as --revision: refs/ (branches and tags) and the snapshots' hashes.
std::string known_revisions(const fs::path& repo_dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(repo_dir / "refs", ec))
    if (entry.is_regular_file()) names.insert(entry.path().filename().string());
  for (const auto& entry : fs::directory_iterator(repo_dir / "snapshots", ec))
    if (entry.is_directory()) names.insert(entry.path().filename().string());
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

std::string fetch_hint(const std::string& repo_id) {
  return "glmserve does not download: fetch it with `hf download " + repo_id +
         "` (into that cache; --download-dir or HF_HUB_CACHE name another), or `hf download " + repo_id +
         " --local-dir DIR` and give DIR";
}

// The snapshot folder of `revision` (empty: main) in a repo's cache folder.
fs::path snapshot_of(const fs::path& repo_dir, const std::string& repo_id, const std::string& revision) {
  const std::string wanted = revision.empty() ? "main" : revision;
  const fs::path ref = repo_dir / "refs" / wanted;
  if (fs::is_regular_file(ref)) {
    const std::string commit = trimmed_first_line(ref);
    const fs::path snapshot = repo_dir / "snapshots" / commit;
    if (commit.empty() || !fs::is_directory(snapshot))
      fail("the Hugging Face cache's " + ref.string() + " names commit '" + commit +
           "', which has no snapshot folder there: the download was cut short; " + fetch_hint(repo_id));
    return snapshot;
  }
  if (fs::is_directory(repo_dir / "snapshots" / wanted)) return repo_dir / "snapshots" / wanted;
  // Fetched at one commit only (no refs/main): that snapshot, when no revision was asked for.
  if (revision.empty()) {
    std::vector<fs::path> snapshots;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(repo_dir / "snapshots", ec))
      if (entry.is_directory()) snapshots.push_back(entry.path());
    if (snapshots.size() == 1) return snapshots.front();
  }
  fail("'" + repo_id + "' is in the Hugging Face cache (" + repo_dir.string() + ") but not at revision '" +
       wanted + "': it has " + known_revisions(repo_dir) + "; give one of those with --revision, or fetch '" +
       wanted + "' with `hf download " + repo_id + " --revision " + wanted + "` (glmserve does not download)");
}

}  // namespace

HubCacheEnvironment HubCacheEnvironment::from_environment() {
  HubCacheEnvironment env;
  env.hf_hub_cache = env_or_empty("HF_HUB_CACHE");
  env.huggingface_hub_cache = env_or_empty("HUGGINGFACE_HUB_CACHE");
  env.hf_home = env_or_empty("HF_HOME");
  env.xdg_cache_home = env_or_empty("XDG_CACHE_HOME");
  env.home = env_or_empty("HOME");
  return env;
}

fs::path hub_cache_dir(const HubCacheEnvironment& env, const std::string& download_dir) {
  if (!download_dir.empty()) return download_dir;
  if (!env.hf_hub_cache.empty()) return env.hf_hub_cache;
  if (!env.huggingface_hub_cache.empty()) return env.huggingface_hub_cache;
  if (!env.hf_home.empty()) return fs::path(env.hf_home) / "hub";
  if (!env.xdg_cache_home.empty()) return fs::path(env.xdg_cache_home) / "huggingface" / "hub";
  return fs::path(env.home.empty() ? "." : env.home) / ".cache" / "huggingface" / "hub";
}

bool looks_like_repo_id(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return repo_name_part(name);
  return repo_name_part(name.substr(0, slash)) && repo_name_part(name.substr(slash + 1));
}

ResolvedModel resolve_model(const std::string& given, const HubCacheEnvironment& env, const std::string& revision,
                            const std::string& download_dir) {
  ResolvedModel resolved;
  if (fs::is_directory(given)) {
    if (!revision.empty())
      fail("--revision " + revision + " picks a snapshot of a Hugging Face repo id; '" + given +
           "' is a local folder: leave --revision out");
    resolved.folder = given;
    return resolved;
  }
  if (fs::exists(given))
    fail("'" + given + "' is a file: give the checkpoint folder that holds config.json, *.safetensors and "
         "tokenizer.json");
  const fs::path cache = hub_cache_dir(env, download_dir);
  if (!looks_like_repo_id(given))
    fail("'" + given + "' is not a local folder: give a checkpoint folder (config.json, *.safetensors, "
         "tokenizer.json) or a Hugging Face repo id such as zai-org/GLM-5.2 fetched into " + cache.string());
  std::string cache_name = "models--" + given;
  const size_t slash = cache_name.find('/');
  if (slash != std::string::npos) cache_name.replace(slash, 1, "--");  // a repo id has one at most
  const fs::path repo_dir = cache / cache_name;
  if (!fs::is_directory(repo_dir))
    fail("'" + given + "' is neither a local folder nor in the Hugging Face cache (no " + repo_dir.string() + "); " +
         fetch_hint(given));
  resolved.folder = snapshot_of(repo_dir, given, revision);
  resolved.repo_id = given;
  resolved.commit = resolved.folder.filename().string();
  if (!fs::exists(resolved.folder / "config.json"))
    fail("the Hugging Face cache's snapshot of '" + given + "' (" + resolved.folder.string() +
         ") has no config.json: the download was cut short; " + fetch_hint(given));
  return resolved;
}

}  // namespace glms::io
