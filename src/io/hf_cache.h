// A model argument -> the checkpoint folder it names: a local folder as given, or a Hugging Face
// repo id ("zai-org/GLM-5.2") looked up in the Hugging Face hub cache, as vLLM and SGLang take it
// (`vllm serve zai-org/GLM-5.2` after `hf download zai-org/GLM-5.2`). glmserve never downloads.
//
// The cache's layout (huggingface_hub's): <hub cache>/models--<org>--<name>/refs/<revision> holds
// a commit hash; snapshots/<hash>/ holds the files. The hub cache is --download-dir where given,
// else $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
#pragma once

#include <filesystem>
#include <string>

namespace glms::io {

// The environment the hub cache's location comes from; from_environment() reads the process's.
struct HubCacheEnvironment {
  std::string hf_hub_cache;             // $HF_HUB_CACHE
  std::string huggingface_hub_cache;    // $HUGGINGFACE_HUB_CACHE (the older name)
  std::string hf_home;                  // $HF_HOME
  std::string xdg_cache_home;           // $XDG_CACHE_HOME
  std::string home;                     // $HOME
  static HubCacheEnvironment from_environment();
};

// The hub cache folder: `download_dir` when not empty, else from the environment as above.
std::filesystem::path hub_cache_dir(const HubCacheEnvironment& env, const std::string& download_dir = "");

// True when `name` has a repo id's form: "name" or "org/name", letters, digits, '.', '_', '-',
// not starting with '.' or '-'. ("models/x" has that form too: a folder by that name wins.)
bool looks_like_repo_id(const std::string& name);

struct ResolvedModel {
  std::filesystem::path folder;  // the checkpoint folder
  std::string repo_id;           // the repo id it came from; empty for a local folder
  std::string commit;            // the snapshot's commit hash; empty for a local folder
};

// `given` as a local folder when one exists; else, for a repo id, its snapshot in the hub cache at
// `revision` (a branch or tag under refs/, default main, or a commit hash). Throws glms::Error with
// where it looked and the command that fetches the model when neither is there, and when the
// snapshot lacks config.json (a download cut short).
ResolvedModel resolve_model(const std::string& given, const HubCacheEnvironment& env,
                            const std::string& revision = "", const std::string& download_dir = "");

}  // namespace glms::io
