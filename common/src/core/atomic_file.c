/* Atomic output files (see atomic_file.h): temporary name in the same directory, fsync, rename,
 * fsync of the directory. The one copy of this sequence; the checkpoint, .npz and safetensors
 * writers all go through it. */
#include "core/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ct__write_full(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w == 0) {
            errno = 0;
        }
        if (w <= 0) {
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

ct_status ct__atomic_file_open(ct__atomic_file *f, const char *path, ct_err *err) {
    f->path = path;
    f->tmp[0] = '\0';
    f->fd = -1;
    char tmp[sizeof f->tmp];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) {
        return ct_err_set(err, CT_EINVAL, "%s: path too long", path);
    }
    f->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot create (%s)", tmp, strerror(errno));
    }
    memcpy(f->tmp, tmp, sizeof tmp);
    return CT_OK;
}

ct_status ct__atomic_file_write(ct__atomic_file *f, const void *buf, size_t len, ct_err *err) {
    if (ct__write_full(f->fd, buf, len) != 0) {
        return ct_err_set(err, CT_EIO, "%s: write failed (%s)", f->tmp,
                          errno ? strerror(errno) : "no progress");
    }
    return CT_OK;
}

void ct__atomic_file_abort(ct__atomic_file *f) {
    if (f->tmp[0] != '\0') {
        close(f->fd);
        unlink(f->tmp);
    }
    f->tmp[0] = '\0';
    f->fd = -1;
}

/* fsync of the directory holding `path`, so the rename survives a crash. Best effort. */
static void sync_parent_dir(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) {
        slash[1] = '\0';
    } else if (slash) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

ct_status ct__atomic_file_commit(ct__atomic_file *f, ct_err *err) {
    if (fsync(f->fd) != 0) {
        ct_status st = ct_err_set(err, CT_EIO, "%s: fsync failed (%s)", f->tmp, strerror(errno));
        ct__atomic_file_abort(f);
        return st;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0 || rename(f->tmp, f->path) != 0) {
        ct_status st = ct_err_set(err, CT_EIO, "%s: cannot %s (%s)", f->path,
                                  rc != 0 ? "close" : "rename into place", strerror(errno));
        unlink(f->tmp);
        f->tmp[0] = '\0';
        return st;
    }
    f->tmp[0] = '\0';
    sync_parent_dir(f->path);
    return CT_OK;
}

ct_status ct__atomic_file_finish(ct__atomic_file *f, ct_status st, ct_err *err) {
    if (st == CT_OK) {
        return ct__atomic_file_commit(f, err);
    }
    ct__atomic_file_abort(f);
    return st;
}

ct_status ct__atomic_write(const char *path, const void *const *parts, const size_t *lens,
                           int n_parts, ct_err *err) {
    ct__atomic_file f = {0};
    ct_status st = ct__atomic_file_open(&f, path, err);
    for (int k = 0; k < n_parts && st == CT_OK; k++) {
        st = ct__atomic_file_write(&f, parts[k], lens[k], err);
    }
    return ct__atomic_file_finish(&f, st, err);
}
