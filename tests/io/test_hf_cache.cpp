// The model argument's resolution: local folders, and repo ids in a Hugging Face hub cache laid out
// as huggingface_hub writes it (refs/<revision> -> snapshots/<commit>/).
#include <gtest/gtest.h>

#include <filesystem>

#include "io/hf_cache.h"
#include "io_test_util.h"

namespace glms::io {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;
using testing::write_file;

const std::string kMainCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kOldCommit = "fedcba9876543210fedcba9876543210fedcba98";

// A cached repo "zai-org/GLM-5.2" with main at kMainCommit and tag v1 at kOldCommit.
fs::path make_cached_repo(const fs::path& cache) {
  const fs::path repo = cache / "models--zai-org--GLM-5.2";
  fs::create_directories(repo / "refs");
  for (const std::string& commit : {kMainCommit, kOldCommit}) {
    fs::create_directories(repo / "snapshots" / commit);
    write_file(repo / "snapshots" / commit / "config.json", "{\"commit\": \"" + commit + "\"}");
  }
  write_file(repo / "refs" / "main", kMainCommit + "\n");  // huggingface_hub writes no newline; accept one
  write_file(repo / "refs" / "v1", kOldCommit);
  return repo;
}

HubCacheEnvironment env_with_home(const fs::path& home) {
  HubCacheEnvironment env;
  env.home = home.string();
  return env;
}

TEST(HubCache, FolderFollowsHuggingFaceHubsEnvironmentOrder) {
  HubCacheEnvironment env;
  env.home = "/h";
  EXPECT_EQ(hub_cache_dir(env), fs::path("/h/.cache/huggingface/hub"));
  env.xdg_cache_home = "/x";
  EXPECT_EQ(hub_cache_dir(env), fs::path("/x/huggingface/hub"));
  env.hf_home = "/hf";
  EXPECT_EQ(hub_cache_dir(env), fs::path("/hf/hub"));
  env.huggingface_hub_cache = "/old";
  EXPECT_EQ(hub_cache_dir(env), fs::path("/old"));
  env.hf_hub_cache = "/new";
  EXPECT_EQ(hub_cache_dir(env), fs::path("/new"));
  EXPECT_EQ(hub_cache_dir(env, "/downloads"), fs::path("/downloads"));
}

TEST(HubCache, RepoIdsHaveAnOrgAndANameAtMost) {
  EXPECT_TRUE(looks_like_repo_id("zai-org/GLM-5.2"));
  EXPECT_TRUE(looks_like_repo_id("gpt2"));
  EXPECT_TRUE(looks_like_repo_id("org_1/model.v2-FP8"));
  EXPECT_FALSE(looks_like_repo_id("/abs/path"));
  EXPECT_FALSE(looks_like_repo_id("./here"));
  EXPECT_FALSE(looks_like_repo_id("../up"));
  EXPECT_FALSE(looks_like_repo_id("a/b/c"));
  EXPECT_FALSE(looks_like_repo_id("org/"));
  EXPECT_FALSE(looks_like_repo_id("org/name with space"));
  EXPECT_FALSE(looks_like_repo_id(""));
}

TEST(HubCache, LocalFolderIsTakenAsGiven) {
  TempDir dir;
  const ResolvedModel model = resolve_model(dir.path().string(), env_with_home(dir.path()));
  EXPECT_EQ(model.folder, dir.path());
  EXPECT_TRUE(model.repo_id.empty());
  expect_error([&] { resolve_model(dir.path().string(), env_with_home(dir.path()), "main"); },
               {"--revision main", "local folder"});
  write_file(dir / "config.json", "{}");
  expect_error([&] { resolve_model((dir / "config.json").string(), env_with_home(dir.path())); },
               {"is a file", "checkpoint folder"});
}

TEST(HubCache, RepoIdResolvesToItsSnapshotAtARevision) {
  TempDir home;
  const fs::path cache = home / ".cache/huggingface/hub";
  const fs::path repo = make_cached_repo(cache);
  const HubCacheEnvironment env = env_with_home(home.path());
  ResolvedModel model = resolve_model("zai-org/GLM-5.2", env);
  EXPECT_EQ(model.folder, repo / "snapshots" / kMainCommit);
  EXPECT_EQ(model.repo_id, "zai-org/GLM-5.2");
  EXPECT_EQ(model.commit, kMainCommit);
  EXPECT_EQ(resolve_model("zai-org/GLM-5.2", env, "v1").folder, repo / "snapshots" / kOldCommit);
  EXPECT_EQ(resolve_model("zai-org/GLM-5.2", env, kOldCommit).folder, repo / "snapshots" / kOldCommit);
  const std::string message =
      expect_error([&] { resolve_model("zai-org/GLM-5.2", env, "v9"); }, {"not at revision 'v9'", "--revision"});
  EXPECT_NE(message.find("main"), std::string::npos) << message;
  EXPECT_NE(message.find("v1"), std::string::npos) << message;
  // --download-dir is a hub cache of its own.
  TempDir downloads;
  expect_error([&] { resolve_model("zai-org/GLM-5.2", env, "", downloads.path().string()); },
               {"neither a local folder nor in the Hugging Face cache", "hf download zai-org/GLM-5.2"});
  make_cached_repo(downloads.path());
  EXPECT_EQ(resolve_model("zai-org/GLM-5.2", env, "", downloads.path().string()).folder.parent_path().parent_path(),
            downloads / "models--zai-org--GLM-5.2");
}

TEST(HubCache, SnapshotFetchedAtOneCommitNeedsNoMainRef) {
  TempDir home;
  const fs::path repo = make_cached_repo(home / ".cache/huggingface/hub");
  fs::remove(repo / "refs" / "main");
  fs::remove(repo / "refs" / "v1");
  fs::remove_all(repo / "snapshots" / kOldCommit);
  EXPECT_EQ(resolve_model("zai-org/GLM-5.2", env_with_home(home.path())).folder, repo / "snapshots" / kMainCommit);
}

TEST(HubCache, CutShortDownloadsAndMissingReposSayHowToFetch) {
  TempDir home;
  const fs::path repo = make_cached_repo(home / ".cache/huggingface/hub");
  const HubCacheEnvironment env = env_with_home(home.path());
  expect_error([&] { resolve_model("zai-org/GLM-5.1", env); },
               {"'zai-org/GLM-5.1' is neither a local folder nor in the Hugging Face cache",
                "models--zai-org--GLM-5.1", "hf download zai-org/GLM-5.1", "--local-dir DIR"});
  fs::remove(repo / "snapshots" / kMainCommit / "config.json");
  expect_error([&] { resolve_model("zai-org/GLM-5.2", env); }, {"has no config.json", "cut short"});
  write_file(repo / "refs" / "main", "ffffffffffffffffffffffffffffffffffffffff");
  expect_error([&] { resolve_model("zai-org/GLM-5.2", env); }, {"no snapshot folder", "cut short"});
  expect_error([&] { resolve_model("/no/such/folder", env); }, {"is not a local folder", "repo id"});
}

}  // namespace
}  // namespace glms::io
