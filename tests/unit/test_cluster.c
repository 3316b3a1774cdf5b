/* The cluster spec: the task view (--task/--chief, cluster files in YAML and JSON, TF_CONFIG),
 * each class of error with a message naming the source, the line and the key, sources that agree
 * and disagree, and the rank/size view (ct_cluster_spec_read). The environment always comes from
 * a small table through a fake getenv, never from the process. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/cluster.h"
#include "helpers.h"

typedef struct env_var {
    const char *name, *value; /* value NULL: unset */
} env_var;

/* Looks `name` up in the NULL-terminated table `user`. */
static const char *fake_getenv(const char *name, void *user) {
    for (const env_var *var = user; var && var->name; var++) {
        if (!strcmp(var->name, name)) {
            return var->value;
        }
    }
    return NULL;
}

/* Reads a cluster from the flags (NULL: not given) and TF_CONFIG (NULL: unset). */
static ct_status read_cluster(const char *task, const char *chief, const char *file,
                              const char *tf_config, ct_cluster *ret, ct_err *err) {
    ct_cluster_flags flags = {.task = task, .chief = chief, .cluster_file = file};
    env_var env[] = {{"TF_CONFIG", tf_config}, {NULL, NULL}};
    return ct_cluster_init(&flags, fake_getenv, env, ret, err);
}

/* Expects the read to fail with `code`, a one-line message holding every given part, and *ret
 * left as it was. */
static void expect_error(const char *task, const char *chief, const char *file,
                         const char *tf_config, ct_status code, ...) {
    ct_cluster c, before;
    ct_err err = {0};
    memset(&c, 0xab, sizeof c);
    before = c;
    ct_status st = read_cluster(task, chief, file, tf_config, &c, &err);
    cr_assert_eq(st, code, "status %d, want %d; message: %s", st, code, err.msg);
    cr_expect_eq(err.code, code);
    cr_expect_null(strchr(err.msg, '\n'), "message is one line: %s", err.msg);
    cr_expect(!memcmp(&c, &before, sizeof c), "*ret was written on error");
    va_list ap;
    va_start(ap, code);
    for (const char *part = va_arg(ap, const char *); part; part = va_arg(ap, const char *)) {
        cr_expect(strstr(err.msg, part) != NULL, "message '%s' lacks '%s'", err.msg, part);
    }
    va_end(ap);
}

#define EXPECT_ERROR(task, chief, file, tf_config, ...)                                            \
    expect_error(task, chief, file, tf_config, CT_EINVAL, __VA_ARGS__, NULL)
#define EXPECT_TF_ERROR(tf_config, ...) EXPECT_ERROR(NULL, NULL, NULL, tf_config, __VA_ARGS__)

/* Reads a cluster that must be valid. */
static ct_cluster read_ok(const char *task, const char *chief, const char *file,
                          const char *tf_config) {
    ct_cluster c;
    ct_err err = {0};
    ct_status st = read_cluster(task, chief, file, tf_config, &c, &err);
    cr_assert_eq(st, CT_OK, "status %d: %s", st, err.msg);
    return c;
}

/* A scratch directory holding one file, for the tests that read a cluster file. */
typedef struct scratch {
    char dir[PATH_MAX];
    char path[PATH_MAX];
} scratch;

/* Creates a directory and writes `text` to a file `name` in it; s->path is that file. */
static void scratch_write(scratch *s, const char *name, const char *text) {
    test_tmpdir_create("test_cluster", s->dir, sizeof s->dir);
    test_write_file(test_path(s->dir, name, s->path, sizeof s->path), text, strlen(text));
}

static void scratch_remove(scratch *s) {
    test_tmpdir_remove(s->dir);
}

#define FOUR_TYPES                                                                                 \
    "{\"cluster\": {\"chief\": [\"c0:2222\"], \"worker\": [\"w0:2222\", \"w1:2222\"], "            \
    "\"ps\": [\"p0:2222\", \"tcp://p1:2223\"], \"evaluator\": [\"e0:2222\"]}, "                    \
    "\"task\": {\"type\": \"worker\", \"index\": 1}, "                                             \
    "\"environment\": \"cloud\", \"rpc_layer\": \"grpc\"}"

Test(cluster, tf_config_all_four_types) {
    ct_cluster c = read_ok(NULL, NULL, NULL, FOUR_TYPES);
    cr_expect_eq(c.n[CT_TASK_CHIEF], 1);
    cr_expect_eq(c.n[CT_TASK_WORKER], 2);
    cr_expect_eq(c.n[CT_TASK_PS], 2);
    cr_expect_eq(c.n[CT_TASK_EVALUATOR], 1);
    cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "c0:2222");
    cr_expect_str_eq(c.addr[CT_TASK_WORKER][0], "w0:2222");
    cr_expect_str_eq(c.addr[CT_TASK_WORKER][1], "w1:2222");
    cr_expect_str_eq(c.addr[CT_TASK_PS][0], "p0:2222");
    cr_expect_str_eq(c.addr[CT_TASK_PS][1], "p1:2223", "tcp:// is stripped");
    cr_expect_str_eq(c.addr[CT_TASK_EVALUATOR][0], "e0:2222");
    cr_expect_eq(c.task_type, CT_TASK_WORKER);
    cr_expect_eq(c.task_index, 1);
    cr_expect(strstr(c.source, "TF_CONFIG") != NULL, "source: %s", c.source);
    ct_cluster_finish(&c);
    cr_expect_null(c.addr[CT_TASK_WORKER]);
    ct_cluster_finish(&c); /* twice is harmless */
}

Test(cluster, data_service_task_types) {
    ct_cluster c = read_ok(NULL, NULL, NULL,
                           "{\"cluster\": {\"chief\": [\"c0:1\"], \"dispatcher\": [\"d0:7460\"], "
                           "\"data_worker\": [\"dw0:0\", \"dw1:0\", \"dw2:0\"]}, "
                           "\"task\": {\"type\": \"data_worker\", \"index\": 2}}");
    cr_expect_eq(c.n[CT_TASK_DISPATCHER], 1);
    cr_expect_eq(c.n[CT_TASK_DATA_WORKER], 3);
    cr_expect_str_eq(c.addr[CT_TASK_DISPATCHER][0], "d0:7460");
    cr_expect_eq(c.task_type, CT_TASK_DATA_WORKER);
    cr_expect_eq(c.task_index, 2);
    ct_cluster_finish(&c);
    EXPECT_TF_ERROR("{\"cluster\": {\"dispatcher\": [\"d0:1\", \"d1:1\"]}}",
                    "TF_CONFIG: cluster.dispatcher", "at most one dispatcher");
    EXPECT_TF_ERROR("{\"cluster\": {\"data_worker\": [\"w:1\"]}, \"task\": {\"type\": "
                    "\"data_worker\", \"index\": 1}}",
                    "data_worker:1 is outside the 1 data_worker tasks");
}

Test(cluster, task_from_tf_config) {
    ct_cluster c = read_ok(NULL, NULL, NULL,
                           "{\"cluster\": {\"ps\": [\"p0:1\", \"p1:1\"]}, "
                           "\"task\": {\"type\": \"ps\", \"index\": 1}}");
    cr_expect_eq(c.task_type, CT_TASK_PS);
    cr_expect_eq(c.task_index, 1);
    cr_expect_eq(c.n[CT_TASK_WORKER], 0, "a list no source gives is unknown");
    cr_expect_null(c.addr[CT_TASK_WORKER]);
    ct_cluster_finish(&c);

    c = read_ok(NULL, NULL, NULL, "{\"task\": {\"type\": \"evaluator\"}}");
    cr_expect_eq(c.task_type, CT_TASK_EVALUATOR);
    cr_expect_eq(c.task_index, 0, "index defaults to 0");
    ct_cluster_finish(&c);
}

Test(cluster, cluster_file_yaml) {
    scratch s;
    scratch_write(&s, "cluster.yaml",
                  "# the training cluster\n"
                  "cluster:\n"
                  "  chief: [\"tcp://10.0.0.1:2222\"]\n"
                  "  worker:\n"
                  "    - 10.0.0.2:2222\n"
                  "    - host-b.example.com:2222\n"
                  "  ps:\n"
                  "    - '*:0'\n"
                  "    - '*:0'\n"
                  "task: {type: ps, index: 1}\n");
    ct_cluster c = read_ok(NULL, NULL, s.path, NULL);
    cr_expect_eq(c.n[CT_TASK_CHIEF], 1);
    cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "10.0.0.1:2222");
    cr_expect_eq(c.n[CT_TASK_WORKER], 2);
    cr_expect_str_eq(c.addr[CT_TASK_WORKER][1], "host-b.example.com:2222");
    cr_expect_eq(c.n[CT_TASK_PS], 2, "port 0 may repeat");
    cr_expect_str_eq(c.addr[CT_TASK_PS][0], "*:0");
    cr_expect_eq(c.n[CT_TASK_EVALUATOR], 0);
    cr_expect_eq(c.task_type, CT_TASK_PS);
    cr_expect_eq(c.task_index, 1);
    cr_expect(strstr(c.source, "cluster.yaml") != NULL, "source: %s", c.source);
    ct_cluster_finish(&c);
    scratch_remove(&s);
}

Test(cluster, cluster_file_json) {
    scratch s;
    scratch_write(&s, "cluster.json",
                  "{\n"
                  "  \"cluster\": {\n"
                  "    \"worker\": [\"w0:1000\", \"w1:1001\", \"w2:1002\"],\n"
                  "    \"ps\": [\"p0:2000\"]\n"
                  "  }\n"
                  "}\n");
    ct_cluster c = read_ok("worker:2", NULL, s.path, NULL);
    cr_expect_eq(c.n[CT_TASK_WORKER], 3);
    cr_expect_str_eq(c.addr[CT_TASK_WORKER][2], "w2:1002");
    cr_expect_eq(c.n[CT_TASK_PS], 1);
    cr_expect_eq(c.task_type, CT_TASK_WORKER, "the task comes from --task");
    cr_expect_eq(c.task_index, 2);
    ct_cluster_finish(&c);
    scratch_remove(&s);
}

Test(cluster, cluster_file_errors_name_file_line_key) {
    scratch s;
    char want[PATH_MAX + 64];
    scratch_write(&s, "bad.yaml",
                  "cluster:\n"
                  "  worker:\n"
                  "    - w0:1\n"
                  "    - w1:99999\n");
    snprintf(want, sizeof want, "%s:4: cluster.worker[1]: 'w1:99999'", s.path);
    EXPECT_ERROR(NULL, NULL, s.path, NULL, want, "65535");
    scratch_remove(&s);
    expect_error(NULL, NULL, "/nonexistent/cluster.yaml", NULL, CT_EIO, "/nonexistent/cluster.yaml",
                 "cannot read", NULL);
    EXPECT_ERROR(NULL, NULL, "", NULL, "--cluster");
}

Test(cluster, flags_alone) {
    ct_cluster c = read_ok("worker:3", "tcp://10.1.2.3:2222", NULL, NULL);
    cr_expect_eq(c.task_type, CT_TASK_WORKER);
    cr_expect_eq(c.task_index, 3, "no worker list: any index");
    cr_expect_eq(c.n[CT_TASK_CHIEF], 1, "--chief alone gives the chief list");
    cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "10.1.2.3:2222");
    cr_expect_eq(c.n[CT_TASK_WORKER], 0);
    cr_expect(strstr(c.source, "--task") && strstr(c.source, "--chief"), "source: %s", c.source);
    ct_cluster_finish(&c);

    c = read_ok("chief", NULL, NULL, NULL);
    cr_expect_eq(c.task_type, CT_TASK_CHIEF);
    cr_expect_eq(c.task_index, 0);
    ct_cluster_finish(&c);
    c = read_ok("evaluator:0", NULL, NULL, NULL);
    cr_expect_eq(c.task_type, CT_TASK_EVALUATOR);
    ct_cluster_finish(&c);
}

Test(cluster, bad_task_flag) {
    EXPECT_ERROR("trainer:1", NULL, NULL, NULL, "--task 'trainer:1'", "unknown task type");
    EXPECT_ERROR("worker:x", NULL, NULL, NULL, "--task 'worker:x'", "index");
    EXPECT_ERROR("worker:", NULL, NULL, NULL, "--task 'worker:'", "index");
    EXPECT_ERROR("worker:1024", NULL, NULL, NULL, "--task 'worker:1024'", "1023");
    EXPECT_ERROR("master:0", NULL, NULL, NULL, "--task", "rename it to 'chief'");
    EXPECT_ERROR("chief:1", NULL, NULL, NULL, "--task", "chief:1", "one chief");
}

Test(cluster, flags_agree_with_tf_config) {
    ct_cluster c = read_ok("worker:1", "c0:2222", NULL, FOUR_TYPES);
    cr_expect_eq(c.task_type, CT_TASK_WORKER);
    cr_expect_eq(c.task_index, 1);
    cr_expect_eq(c.n[CT_TASK_WORKER], 2);
    cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "c0:2222");
    ct_cluster_finish(&c);
    c = read_ok(NULL, "tcp://c0:2222", NULL, FOUR_TYPES);
    cr_expect_eq(c.n[CT_TASK_CHIEF], 1);
    ct_cluster_finish(&c);
}

Test(cluster, flags_disagree_with_tf_config) {
    EXPECT_ERROR("worker:0", NULL, NULL, FOUR_TYPES, "--task", "worker:0", "TF_CONFIG", "worker:1");
    EXPECT_ERROR("ps:1", NULL, NULL, FOUR_TYPES, "--task", "ps:1", "TF_CONFIG", "worker:1");
    EXPECT_ERROR(NULL, "c9:2222", NULL, FOUR_TYPES, "--chief", "c9:2222", "TF_CONFIG", "c0:2222");
}

Test(cluster, cluster_file_disagrees_with_tf_config) {
    scratch s;
    scratch_write(&s, "c.yaml", "cluster:\n  worker: [w0:1, w1:1, w2:1]\n");
    EXPECT_ERROR(NULL, NULL, s.path, FOUR_TYPES, s.path, "3 worker", "TF_CONFIG", "2");
    scratch_remove(&s);
}

Test(cluster, index_out_of_range) {
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}, "
                    "\"task\": {\"type\": \"worker\", \"index\": 2}}",
                    "TF_CONFIG: task.index", "worker:2", "2 worker");
    EXPECT_ERROR("ps:2", NULL, NULL, "{\"cluster\": {\"ps\": [\"p0:1\", \"p1:1\"]}}", "--task",
                 "ps:2", "2 ps", "TF_CONFIG");
    EXPECT_TF_ERROR("{\"task\": {\"type\": \"worker\", \"index\": -1}}", "TF_CONFIG: task.index");
}

Test(cluster, bad_port) {
    EXPECT_TF_ERROR("{\"cluster\": {\"ps\": [\"p0:70000\"]}}", "TF_CONFIG: cluster.ps[0]",
                    "'p0:70000'", "[0, 65535]");
    EXPECT_TF_ERROR("{\"cluster\": {\"ps\": [\"p0:http\"]}}", "TF_CONFIG: cluster.ps[0]",
                    "not a number");
    EXPECT_TF_ERROR("{\"cluster\": {\"ps\": [\"p0:\"]}}", "TF_CONFIG: cluster.ps[0]",
                    "not a number");
    EXPECT_TF_ERROR("{\"cluster\": {\"ps\": [\"p0:-1\"]}}", "TF_CONFIG: cluster.ps[0]");
    EXPECT_ERROR(NULL, "c0:123456", NULL, NULL, "--chief 'c0:123456'", "[0, 65535]");
}

Test(cluster, bad_address) {
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"w0:1\", \"w1\"]}}",
                    "TF_CONFIG: cluster.worker[1]: 'w1'", "':PORT'");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\":2222\"]}}", "cluster.worker[0]", "no host");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"a b:2222\"]}}", "cluster.worker[0]",
                    "host name");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"\"]}}", "cluster.worker[0]", "empty");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [[\"w0:1\"]]}}", "cluster.worker[0]", "host:port");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": \"w0:1\"}}", "TF_CONFIG: cluster.worker",
                    "must be a list");
    EXPECT_ERROR(NULL, "localhost", NULL, NULL, "--chief 'localhost'", "':PORT'");
}

Test(cluster, ipv6_addresses) {
    ct_cluster c = read_ok(NULL, NULL, NULL, "{\"cluster\": {\"worker\": [\"tcp://[::1]:2222\"]}}");
    cr_expect_str_eq(c.addr[CT_TASK_WORKER][0], "[::1]:2222");
    ct_cluster_finish(&c);
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"::1:2222\"]}}", "cluster.worker[0]", "brackets");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"[::1]\"]}}", "cluster.worker[0]", "':PORT'");
}

Test(cluster, duplicate_address) {
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"w0:1\", \"h:2\"], \"ps\": [\"h:2\"]}}",
                    "TF_CONFIG: cluster.ps[0]", "'h:2'", "worker[1]");
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"h:2\", \"tcp://h:2\"]}}", "cluster.worker[1]",
                    "worker[0]");
    EXPECT_ERROR(NULL, "w0:1", NULL, "{\"cluster\": {\"worker\": [\"w0:1\"]}}",
                 "TF_CONFIG: cluster.worker[0]", "chief[0]'s (--chief)");
    ct_cluster c = read_ok(NULL, NULL, NULL, "{\"cluster\": {\"worker\": [\"h:0\", \"h:0\"]}}");
    cr_expect_eq(c.n[CT_TASK_WORKER], 2, "port 0 may repeat");
    ct_cluster_finish(&c);
}

Test(cluster, unknown_keys) {
    EXPECT_TF_ERROR("{\"clusters\": {}}", "TF_CONFIG: clusters", "unknown key");
    EXPECT_TF_ERROR("{\"cluster\": {\"workers\": [\"w0:1\"]}}", "TF_CONFIG: cluster.workers",
                    "unknown task type 'workers'", "chief, worker, ps, evaluator");
    EXPECT_TF_ERROR("{\"task\": {\"type\": \"worker\", \"idx\": 0}}", "TF_CONFIG: task.idx",
                    "unknown key");
    EXPECT_TF_ERROR("{\"task\": {\"type\": \"trainer\"}}", "TF_CONFIG: task.type", "trainer");
    EXPECT_TF_ERROR("{\"task\": {\"index\": 0}}", "TF_CONFIG: task", "no 'type'");
}

Test(cluster, master_is_rejected) {
    EXPECT_TF_ERROR("{\"cluster\": {\"master\": [\"m:1\"]}}", "TF_CONFIG: cluster.master",
                    "rename it to 'chief'");
    EXPECT_TF_ERROR("{\"task\": {\"type\": \"master\", \"index\": 0}}", "TF_CONFIG: task.type",
                    "rename it to 'chief'");
}

Test(cluster, chief_list_of_two) {
    EXPECT_TF_ERROR("{\"cluster\": {\"chief\": [\"c0:1\", \"c1:1\"]}}", "TF_CONFIG: cluster.chief",
                    "at most one chief");
}

Test(cluster, malformed_json) {
    EXPECT_TF_ERROR("{\"cluster\": {\"worker\": [\"w0:1\"],\n \"ps\": [}", "TF_CONFIG:2");
    EXPECT_TF_ERROR("{\"cluster\": ", "TF_CONFIG:1");
    EXPECT_TF_ERROR("[\"w0:1\"]", "TF_CONFIG", "mapping");
    /* A TF_CONFIG that spans lines gives line numbers with its keys. */
    EXPECT_TF_ERROR("{\"cluster\": {\n  \"worker\": [\"w0:1\"],\n  \"ps\": [\"p0\"]}}",
                    "TF_CONFIG:3: cluster.ps[0]");
}

Test(cluster, no_source) {
    ct_cluster c;
    ct_err err = {0};
    cr_assert_eq(ct_cluster_init(NULL, fake_getenv, NULL, &c, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(c.task_type, -1);
    cr_expect_eq(c.task_index, -1);
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        cr_expect_eq(c.n[type], 0);
        cr_expect_null(c.addr[type]);
    }
    cr_expect(strstr(c.source, "no source") != NULL, "source: %s", c.source);
    ct_cluster_finish(&c);

    c = read_ok(NULL, NULL, NULL, "");
    cr_expect_eq(c.task_type, -1, "an empty TF_CONFIG says nothing");
    ct_cluster_finish(&c);
    c = read_ok(NULL, NULL, NULL, "{\"environment\": \"cloud\"}");
    cr_expect_eq(c.task_type, -1);
    cr_expect_eq(c.n[CT_TASK_WORKER], 0);
    ct_cluster_finish(&c);
}

Test(cluster, finish_accepts_zeroed) {
    ct_cluster c;
    memset(&c, 0, sizeof c);
    ct_cluster_finish(&c);
    ct_cluster_finish(NULL);
}

Test(cluster, task_type_names) {
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        cr_expect_eq(ct_task_type_parse(ct_task_type_name(type)), type);
    }
    cr_expect_str_eq(ct_task_type_name(CT_TASK_PS), "ps");
    cr_expect_null(ct_task_type_name(-1));
    cr_expect_null(ct_task_type_name(CT_TASK_TYPES));
    cr_expect_eq(ct_task_type_parse("master"), -1);
    cr_expect_eq(ct_task_type_parse(NULL), -1);
}

Test(cluster, spec_read_still_works) {
    env_var env[] = {{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {NULL, NULL}};
    ct_cluster_spec spec;
    ct_err err = {0};
    cr_assert_eq(ct_cluster_spec_read(-1, -1, -1, fake_getenv, env, &spec, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(spec.rank, 1);
    cr_expect_eq(spec.world_size, 4);
    cr_expect_eq(spec.local_rank, 1);
    cr_expect_eq(ct_cluster_spec_read(2, 4, -1, fake_getenv, env, &spec, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "OMPI_COMM_WORLD_RANK") != NULL, "message: %s", err.msg);
}

/* ---- tasks from a launcher's ranks ---- */

static ct_status from_launcher(const env_var *env, int n_ps, ct_cluster *c, ct_err *err) {
    ct_cluster_flags none = {0};
    ct_status st = ct_cluster_init(&none, fake_getenv, (void *)env, c, err);
    cr_assert_eq(st, CT_OK, "%s", err->msg);
    return ct_cluster_from_launcher(c, n_ps, fake_getenv, (void *)env, err);
}

Test(cluster, slurm_ranks_become_chief_servers_and_workers) {
    const char *want_type[] = {"chief", "ps", "ps", "worker", "worker"};
    int want_index[] = {0, 0, 1, 0, 1};
    for (int rank = 0; rank < 5; rank++) {
        char r[8];
        snprintf(r, sizeof r, "%d", rank);
        env_var env[] = {{"SLURM_PROCID", r},
                         {"SLURM_NTASKS", "5"},
                         {"SLURM_JOB_NODELIST", "node[07-10,12],login3"},
                         {NULL, NULL}};
        ct_cluster c;
        ct_err err = {0};
        cr_assert_eq(from_launcher(env, 2, &c, &err), CT_OK, "%s", err.msg);
        cr_expect_str_eq(ct_task_type_name(c.task_type), want_type[rank]);
        cr_expect_eq(c.task_index, want_index[rank]);
        cr_expect_eq(c.n[CT_TASK_PS], 2);
        cr_expect_eq(c.n[CT_TASK_WORKER], 2);
        cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "node07:7450", "the first node of the list");
        cr_expect_str_eq(c.addr[CT_TASK_PS][1], "*:0");
        cr_expect(strstr(c.source, "rank") && strstr(c.source, "SLURM_PROCID"), "%s", c.source);
        ct_cluster_finish(&c);
    }
}

Test(cluster, launcher_host_port_and_errors) {
    env_var ompi[] = {{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"CTRAIN_CHIEF_HOST", "10.0.0.5"},
                      {"CTRAIN_CHIEF_PORT", "9001"},
                      {NULL, NULL}};
    ct_cluster c;
    ct_err err = {0};
    cr_assert_eq(from_launcher(ompi, 1, &c, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(c.task_type, CT_TASK_WORKER);
    cr_expect_eq(c.task_index, 1);
    cr_expect_str_eq(c.addr[CT_TASK_CHIEF][0], "10.0.0.5:9001");
    ct_cluster_finish(&c);
    /* no launcher (or one process): nothing changes */
    env_var alone[] = {{NULL, NULL}};
    cr_assert_eq(from_launcher(alone, 1, &c, &err), CT_OK);
    cr_expect_eq(c.task_type, -1);
    ct_cluster_finish(&c);
    /* a task named by a flag wins over the rank */
    ct_cluster_flags flags = {.task = "ps:0", .chief = "c:1"};
    cr_assert_eq(ct_cluster_init(&flags, fake_getenv, ompi, &c, &err), CT_OK);
    cr_assert_eq(ct_cluster_from_launcher(&c, 1, fake_getenv, ompi, &err), CT_OK);
    cr_expect_eq(c.task_type, CT_TASK_PS);
    ct_cluster_finish(&c);
    /* too few tasks, a bad port */
    env_var two[] = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {NULL, NULL}};
    cr_expect_eq(from_launcher(two, 1, &c, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "2 tasks") && strstr(err.msg, "leave no worker"), "%s", err.msg);
    ct_cluster_finish(&c);
    env_var port[] = {
        {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"CTRAIN_CHIEF_PORT", "70000"}, {NULL, NULL}};
    cr_expect_eq(from_launcher(port, 1, &c, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "CTRAIN_CHIEF_PORT=\"70000\""), "%s", err.msg);
    ct_cluster_finish(&c);
}
