// stagefs run's pure parts (fusefs/run/): the site's settings and their patterns, what it
// reads of the Slurm job, the daemons' step, and what it makes of the step's output.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "fusefs/run/run.h"
#include "fusefs/run/site.h"
#include "fusefs/run/slurm.h"

namespace stagefs::run {
namespace {

TEST(SiteConfigTest, DefaultsAreAPerJobMountAndAPerUserCache) {
  auto c = parse_site_config("", "conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->mount, "/stage/%j");
  EXPECT_EQ(c->cache, "/nvme/stagefs/%u");
  EXPECT_EQ(c->cache_size, "50%");
  EXPECT_EQ(c->spare_caches, "4");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(SiteConfigTest, ReadsWhatAShellWouldSource) {
  auto c = parse_site_config(
      "# the site\n"
      "STAGEFS_MOUNT=/local/stage/%j\n"
      "  STAGEFS_CACHE=\"/local/cache/%u\"  \n"
      "\n"
      "STAGEFS_CACHE_SIZE='200G'\n"
      "STAGEFS_SPARE_CACHES=2\n"
      "STAGEFS_PURGE_AFTER_DAYS=30\n"  // the epilog's: known, not used here
      "STAGEFS_PURGE_ABOVE=80\n"
      "STAGEFS_FUSE_MODE=0666\n"
      "STAGEFS_MOUTN=/x\n",  // a typo: reported, ignored
      "site.conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->mount, "/local/stage/%j");
  EXPECT_EQ(c->cache, "/local/cache/%u");
  EXPECT_EQ(c->cache_size, "200G");
  EXPECT_EQ(c->spare_caches, "2");
  ASSERT_EQ(c->warnings.size(), 1U);
  EXPECT_EQ(c->warnings[0], "site.conf:10: unknown key STAGEFS_MOUTN (ignored)");
}

TEST(SiteConfigTest, RefusesWhatAShellWouldReadDifferently) {
  for (const char* text : {"STAGEFS_MOUNT=/stage/$USER\n", "STAGEFS_MOUNT=/a b\n", "STAGEFS_MOUNT=\"/a\n",
                           "STAGEFS_MOUNT=`id`\n"}) {
    auto c = parse_site_config(text, "site.conf");
    ASSERT_FALSE(c) << text;
    EXPECT_NE(c.error().message.find("site.conf:1: STAGEFS_MOUNT"), std::string::npos) << c.error().message;
  }
  auto bad = parse_site_config("# fine\njust words\n", "site.conf");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "site.conf:2: not a KEY=VALUE line: 'just words'");
}

TEST(SiteConfigTest, AMissingFileMeansTheDefaults) {
  auto c = load_site_config("/nonexistent/stagefs.conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->mount, "/stage/%j");
}

TEST(PatternTest, CodesStandForTheJobAndTheUser) {
  const PatternValues v{"4242", "alice", 1001};
  EXPECT_EQ(expand_pattern("/stage/%j", v).value(), "/stage/4242");
  EXPECT_EQ(expand_pattern("/nvme/stagefs/%u", v).value(), "/nvme/stagefs/alice");
  EXPECT_EQ(expand_pattern("/n/%U/%j-%%", v).value(), "/n/1001/4242-%");
  auto unknown = expand_pattern("/stage/%x", v);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("unknown code %x"), std::string::npos);
  EXPECT_FALSE(expand_pattern("/stage/%", v));
}

TEST(PatternTest, AValueIsOneDirectoryName) {
  EXPECT_FALSE(expand_pattern("/c/%u", PatternValues{"1", "", 5}));  // a uid without a name
  EXPECT_FALSE(expand_pattern("/c/%u", PatternValues{"1", "..", 5}));
  EXPECT_FALSE(expand_pattern("/c/%j", PatternValues{"1/../../etc", "a", 5}));
  auto r = expand_pattern("/c/%u", PatternValues{"1", ".", 5});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("not a directory name"), std::string::npos);
}

Env env_of(const std::map<std::string, std::string>& m) {
  return [m](const char* name) -> const char* {
    auto it = m.find(name);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

TEST(SlurmJobTest, OutsideAJobItSaysSoAndWhatToDoInstead) {
  auto none = slurm_job(env_of({}));
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("not inside a Slurm job (SLURM_JOB_ID is not set)"), std::string::npos);
  EXPECT_NE(none.error().message.find("stagefs SOURCE_DIR MOUNTPOINT --cache DIR"), std::string::npos);

  // salloc's shell: a job, but this shell is on the login node
  auto login = slurm_job(env_of({{"SLURM_JOB_ID", "12"}, {"SLURM_JOB_NUM_NODES", "4"}}));
  ASSERT_FALSE(login);
  EXPECT_NE(login.error().message.find("not run on a node of job 12"), std::string::npos);
  EXPECT_NE(login.error().message.find("salloc"), std::string::npos);

  auto bad =
      slurm_job(env_of({{"SLURM_JOB_ID", "12"}, {"SLURMD_NODENAME", "n1"}, {"SLURM_JOB_NUM_NODES", "4x"}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("SLURM_JOB_NUM_NODES is '4x'"), std::string::npos);
}

TEST(SlurmJobTest, TheJobsNodesNotTheSteps) {
  // an interactive step (srun --pty bash) of a 4-node job: SLURM_NNODES is the step's 1
  auto job = slurm_job(env_of({{"SLURM_JOB_ID", "12"},
                               {"SLURMD_NODENAME", "n1"},
                               {"SLURM_JOB_NUM_NODES", "4"},
                               {"SLURM_NNODES", "1"}}));
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->id, "12");
  EXPECT_EQ(job->nodes, 4U);
  EXPECT_EQ(job->node, "n1");
}

TEST(DaemonStepTest, OneOverlappingTaskPerNodeThatEndsTheStepWhenItFails) {
  const SlurmJob job{"12", 64, "n1"};
  const auto argv =
      daemon_step(job, {"/usr/bin/stagefs", "/shared", "/stage/12", "--cache", "/nvme/stagefs/alice"});
  const std::vector<std::string> want{"srun",
                                      "--overlap",
                                      "--job-name=stagefs",
                                      "--nodes=64",
                                      "--ntasks=64",
                                      "--ntasks-per-node=1",
                                      "--kill-on-bad-exit=1",
                                      "--mpi=pmix",
                                      "--quiet",
                                      "/usr/bin/stagefs",
                                      "/shared",
                                      "/stage/12",
                                      "--cache",
                                      "/nvme/stagefs/alice"};
  EXPECT_EQ(argv, want);
}

TEST(DaemonStepTest, StartsWithoutPyxisContainerVariables) {
  const char* env[] = {"PATH=/usr/bin",
                       "PYXIS_CONTAINER_IMAGE=/stage/12/app.sqsh",
                       "PYXIS_CONTAINER_MOUNTS=/data:/data",
                       "SLURM_JOB_ID=12",
                       "MY_PYXIS_CONTAINER_NOTE=kept",
                       nullptr};
  const std::vector<std::string> want{"PATH=/usr/bin", "SLURM_JOB_ID=12", "MY_PYXIS_CONTAINER_NOTE=kept"};
  EXPECT_EQ(step_environment(env), want);
}

TEST(StepOutputTest, TheCauseIsTheNodeThatFailedNotTheEchoOfOthers) {
  EXPECT_TRUE(is_cause_line("[stagefs n3 r2] error: mount point /stage/12 is not empty: it holds 'x'\n"));
  EXPECT_TRUE(is_cause_line("srun: error: n3: task 2: Exited with exit code 1\n"));
  EXPECT_FALSE(is_cause_line("[stagefs n1 r0] error: another node failed to mount; unmounting\n"));
  EXPECT_FALSE(is_cause_line("[stagefs n1 r0] info: materialized app.sqsh (5 bytes) in 0.1 s\n"));
}

TEST(SummaryTest, TransfersBytesAndWhereTheyWereRead) {
  const std::string stats =
      R"({"ranks":4,"host":"n1","transfers":3,"batches":1,"batch_files":5,"bytes_broadcast":3221225472,)"
      R"("bytes_from_source":1073741824,"bytes_from_seeds":2147483648,"transfer_failures":0,"opens":9,"cache_hits":6})";
  EXPECT_EQ(summary_line(stats),
            "4 nodes, 3 transfers (5 small files in 1 batch), 3.00 GiB staged: 1.00 GiB read from the shared "
            "source, 2.00 GiB from node caches; on n1 9 opens, 6 from the cache");
  EXPECT_EQ(summary_line(R"({"ranks":1,"host":"n1","transfers":1,"transfer_failures":1,"opens":1})"),
            "1 node, 1 transfer, 1 failed; on n1 1 open, 0 from the cache");
  // A job whose files every node already held (a replayed profile on warm caches) copied nothing.
  EXPECT_EQ(summary_line(R"({"ranks":4,"host":"n1","transfers":3,"nothing_to_copy":3,"batches":2,)"
                         R"("batch_files":0,"opens":2,"cache_hits":2})"),
            "4 nodes, 0 transfers; on n1 2 opens, 2 from the cache");
  EXPECT_EQ(summary_line(""), "the mount's counters could not be read");
}

}  // namespace
}  // namespace stagefs::run
