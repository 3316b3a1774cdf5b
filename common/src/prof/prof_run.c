/* The profiler's run-level steps (prof_file.h): a role writes its dump into
 * <run_dir>/profile/<role>.<task>.ctprof; the chief (the process itself in single-process
 * `ctrain train`) reads every role's file back and writes the merged outputs:
 * <run_dir>/trace.json.gz (Chrome trace events) and, when the XSpace writer is built in, one
 * <run_dir>/plugins/profile/<run>/<host>.xplane.pb per host for TensorBoard's Profile tab. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/profile.h"
#include "prof/prof.h"
#include "prof/prof_file.h"

#include "core/clock.h"
#include "prof/xplane_write.h"

/* A merge takes well under a second: one that holds the lock longer hangs. */
#define MERGE_LOCK_S 60.0

int ct__prof_role_path(const char *run_dir, const char *role, int task, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s/profile/%s.%d.ctprof", run_dir, role, task);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* mkdir -p dir; 0 or -1 with errno set. */
static int make_dirs(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

ct_status ct__prof_write_role(const char *run_dir, long long *ret_events, long long *ret_dropped,
                              ct_err *err) {
    if (!ct__prof_armed()) {
        return CT_OK;
    }
    ct__prof_dump *d = NULL;
    char dir[4096], path[4200];
    ct_status st = ct__prof_take(&d, err);
    if (st != CT_OK) {
        return st;
    }
    snprintf(dir, sizeof dir, "%s/profile", run_dir);
    if (ct__prof_role_path(run_dir, d->role, d->task, path, sizeof path) != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: run directory path too long", run_dir);
    } else if (make_dirs(dir) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: cannot create (%s)", dir, strerror(errno));
    } else {
        st = ct__prof_file_write(d, path, err);
    }
    *ret_events = d->n_events;
    *ret_dropped = d->dropped;
    ct__prof_dump_free(d);
    return st;
}

void ct__prof_dumps_free(ct__prof_dump **dumps, int n) {
    for (int i = 0; dumps && i < n; i++) {
        ct__prof_dump_free(dumps[i]);
    }
    free(dumps);
}

/* The chief first, then by role name and task. */
static int by_role(const void *pa, const void *pb) {
    const ct__prof_dump *a = *(ct__prof_dump *const *)pa, *b = *(ct__prof_dump *const *)pb;
    int ca = strcmp(a->role, "chief") != 0, cb = strcmp(b->role, "chief") != 0;
    if (ca != cb) {
        return ca - cb;
    }
    int c = strcmp(a->role, b->role);
    return c ? c : (a->task > b->task) - (a->task < b->task);
}

static int is_profile(const char *name) {
    size_t len = strlen(name);
    return len > 7 && name[0] != '.' && !strcmp(name + len - 7, ".ctprof");
}

ct_status ct__prof_read_run(const char *run_dir, ct__prof_dump ***ret_dumps, int *ret_n,
                            ct_err *err) {
    char dir[4096], path[4400];
    snprintf(dir, sizeof dir, "%s/profile", run_dir);
    DIR *dh = opendir(dir);
    if (!dh) {
        return ct_err_set(err, CT_ENOENT,
                          "%s: no profile here (%s; train with --profile FIRST:LAST or "
                          "train.profile.steps)",
                          dir, strerror(errno));
    }
    ct__prof_dump **dumps = NULL;
    int n = 0, cap = 0;
    ct_status st = CT_OK;
    for (struct dirent *de; st == CT_OK && (de = readdir(dh));) {
        if (!is_profile(de->d_name)) {
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            ct__prof_dump **grown = realloc(dumps, (size_t)cap * sizeof *dumps);
            if (!grown) {
                st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
                break;
            }
            dumps = grown;
        }
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if ((st = ct__prof_file_read(path, &dumps[n], err)) == CT_OK) {
            n++;
        }
    }
    closedir(dh);
    if (st == CT_OK && n == 0) {
        st = ct_err_set(err, CT_ENOENT, "%s: no *.ctprof files", dir);
    }
    if (st != CT_OK) {
        ct__prof_dumps_free(dumps, n);
        return st;
    }
    qsort(dumps, (size_t)n, sizeof *dumps, by_role);
    *ret_dumps = dumps;
    *ret_n = n;
    return CT_OK;
}

#define XSPACE_RUN ".xspace_run" /* in <run_dir>/profile: the TensorBoard run's name */

/* The TensorBoard run's name: the one an earlier merge of this recording chose (kept in
 * profile/.xspace_run, which ct_profile_clear removes with the recording), else the local time
 * of the earliest event. So merging again, when a late role added its file (and maybe earlier
 * events: a data worker produces ahead of the trainer), replaces that run instead of adding a
 * second one. */
static void xspace_run_name(const char *run_dir, ct__prof_dump **dumps, int n, char run[32]) {
    char path[4200], got[32] = "";
    snprintf(path, sizeof path, "%s/profile/" XSPACE_RUN, run_dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(got, sizeof got, f)) {
            got[0] = '\0';
        }
        fclose(f);
    }
    got[strcspn(got, "\n")] = '\0';
    if (strlen(got) == 19 && strspn(got, "0123456789_") == 19) {
        memcpy(run, got, 20);
        return;
    }
    int64_t first_ns = ct__prof_earliest_ns((const ct__prof_dump *const *)dumps, n);
    time_t start = first_ns > 0 ? (time_t)(first_ns / 1000000000LL) : ct__wall_s();
    struct tm tm;
    strftime(run, 32, "%Y_%m_%d_%H_%M_%S", localtime_r(&start, &tm));
}

/* One <host>-<role>-<task>.xplane.pb per role under plugins/profile/<run>/ (the run named by the
 * local time of its earliest event, as TensorFlow names its profile runs by the time they
 * started): TensorBoard's Profile tab lists each as a host, its plane /host:CPU feeds the
 * overview and input-pipeline pages of that role, and selecting several merges them by step. */
static ct_status write_xplanes(const char *run_dir, ct__prof_dump **dumps, int n, ct_err *err) {
    char dir[4096], path[4400], run[32];
    xspace_run_name(run_dir, dumps, n, run);
    snprintf(dir, sizeof dir, "%s/plugins/profile/%s", run_dir, run);
    if (make_dirs(dir) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot create (%s)", dir, strerror(errno));
    }
    ct_status st = CT_OK;
    for (int i = 0; i < n && st == CT_OK; i++) {
        const ct__prof_dump *one[1] = {dumps[i]};
        snprintf(path, sizeof path, "%s/%s-%s-%d.xplane.pb", dir, dumps[i]->host, dumps[i]->role,
                 dumps[i]->task);
        st = ct__prof_write_xplane(one, 1, path, err);
    }
    snprintf(path, sizeof path, "%s/profile/" XSPACE_RUN, run_dir);
    FILE *f = st == CT_OK ? fopen(path, "w") : NULL;
    if (f) { /* the name for the merges to come (best effort: without it they name it again) */
        fprintf(f, "%s\n", run);
        fclose(f);
    }
    return st;
}

/* Takes the run's merge lock into *ret_fd (close it to release). */
static ct_status lock_merge(const char *run_dir, int *ret_fd, ct_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/profile/.merge.lock", run_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return ct_err_set(err, errno == ENOENT ? CT_ENOENT : CT_EIO,
                          "%s: cannot open (%s; train with --profile FIRST:LAST or "
                          "train.profile.steps)",
                          path, strerror(errno));
    }
    struct timespec pause = {0, 10000000};
    const double start = ct__now_s();
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        double waited = ct__now_s() - start;
        if (errno != EWOULDBLOCK || waited > MERGE_LOCK_S) {
            close(fd);
            return ct_err_set(
                err, CT_ETIMEDOUT, "%s: another merge of this run held the lock for %.0f s (%s)",
                path, waited, errno == EWOULDBLOCK ? "a hung ctrain process?" : strerror(errno));
        }
        nanosleep(&pause, NULL);
    }
    *ret_fd = fd;
    return CT_OK;
}

ct_status ct__prof_merge_run(const char *run_dir, ct_err *err) {
    ct__prof_dump **dumps = NULL;
    int n = 0, lock = -1;
    char path[4200];
    ct_status st = lock_merge(run_dir, &lock, err);
    if (st == CT_OK) {
        st = ct__prof_read_run(run_dir, &dumps, &n, err);
    }
    for (int k = 0; st == CT_OK && k < n; k++) { /* the viewers draw nested slices only */
        st = ct__prof_dump_nest(dumps[k], err);
    }
    if (st != CT_OK) {
        ct__prof_dumps_free(dumps, n);
        if (lock >= 0) {
            close(lock);
        }
        return st;
    }
    snprintf(path, sizeof path, "%s/trace.json.gz", run_dir);
    st = ct__prof_write_trace_json((const ct__prof_dump *const *)dumps, n, path, err);
    if (st == CT_OK) {
        st = write_xplanes(run_dir, dumps, n, err);
    }
    ct__prof_dumps_free(dumps, n);
    close(lock);
    return st;
}

/* ---- the public API (ctrain/profile.h) ---- */

ct_status ct_profile_parse_flag(const char *value, char *ret_set, size_t size, ct_err *err) {
    char *end = NULL;
    long long first = value ? strtoll(value, &end, 10) : 0, last = 0;
    int ok = end && end != value && *end == ':';
    if (ok) {
        const char *rest = end + 1;
        last = strtoll(rest, &end, 10);
        ok = end != rest && *end == '\0' && first >= 1 && last >= first;
    }
    if (!ok ||
        snprintf(ret_set, size, "train.profile.steps=[%lld, %lld]", first, last) >= (int)size) {
        return ct_err_set(err, CT_EINVAL,
                          "--profile needs FIRST:LAST, two step numbers with 1 <= FIRST <= LAST "
                          "(e.g. 150:160), got '%s'",
                          value ? value : "");
    }
    return CT_OK;
}

ct_status ct_profile_start(const int64_t steps[2], const char *role, int task, ct_err *err) {
    if (steps[0] <= 0) {
        return CT_OK;
    }
    ct__prof_options o = {
        .first_step = steps[0], .last_step = steps[1], .role = role, .task = task};
    ct__prof_thread_name("main");
    return ct__prof_init(&o, err);
}

int ct_profile_started(void) {
    return ct__prof_armed();
}

ct_status ct_profile_write(const char *run_dir, long long *ret_events, long long *ret_dropped,
                           ct_err *err) {
    long long events = 0, dropped = 0;
    ct_status st = ct__prof_write_role(run_dir, &events, &dropped, err);
    if (st == CT_OK && ret_events) {
        *ret_events = events;
    }
    if (st == CT_OK && ret_dropped) {
        *ret_dropped = dropped;
    }
    return st;
}

ct_status ct_profile_merge(const char *run_dir, ct_err *err) {
    return ct__prof_merge_run(run_dir, err);
}

ct_status ct_profile_clear(const char *run_dir, ct_err *err) {
    char dir[4096], path[4400];
    snprintf(dir, sizeof dir, "%s/profile", run_dir);
    DIR *dh = opendir(dir);
    if (!dh) {
        return CT_OK; /* nothing recorded here yet */
    }
    ct_status st = CT_OK;
    for (struct dirent *de; (de = readdir(dh));) {
        if (is_profile(de->d_name) || !strcmp(de->d_name, XSPACE_RUN)) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (unlink(path) != 0 && errno != ENOENT && st == CT_OK) {
                st = ct_err_set(err, CT_EIO, "%s: cannot remove (%s)", path, strerror(errno));
            }
        }
    }
    closedir(dh);
    return st;
}

void ct_profile_stop(void) {
    if (ct__prof_armed()) {
        ct__prof_shutdown();
    }
}
