/* The .npz reader: any zip np.savez or np.savez_compressed writes (stored or deflate members,
 * ZIP64 records), each member decoded as a .npy (npy.c). Sizes come only from the central
 * directory (numpy writes ZIP64 local headers whose size fields are 0xFFFFFFFF); every offset is
 * checked against the file size before it is read, a deflated member may not claim more than
 * deflate can produce, and each member's CRC is checked, so a truncated or garbage file gives
 * CT_EINVAL naming the file and the member or byte, never a crash or a huge allocation. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npz_internal.h"

#define ZIP64_END_SIG 0x06064b50u
#define ZIP64_LOCATOR_SIG 0x07064b50u
#define ZIP64_END_BYTES 56
#define ZIP64_LOCATOR_BYTES 20
#define ZIP_MAX_COMMENT 65535

/* Deflate cannot expand data by more than about 1032:1, so a member that claims more is corrupt;
 * checking this keeps a tiny bad file from asking for gigabytes. */
#define DEFLATE_MAX_RATIO 1032

struct ct_npz {
    int n;
    ct_named_array *arrays;
    void **bufs; /* owner of arrays[i].data */
};

typedef struct zip_in {
    const char *path;
    int fd;
    uint64_t size;
} zip_in;

/* A member name fit for a one-line message: control bytes become '?', long names are cut. */
static void printable_name(const unsigned char *name, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len && k + 4 < cap; i++) {
        out[k++] = (name[i] < 0x20 || name[i] == 0x7f) ? '?' : (char)name[i];
    }
    if (k < len) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}

/* Reads len bytes at off; the caller has checked off + len <= size, so a short read means the
 * file shrank under us. */
static ct_status read_at(const zip_in *z, void *buf, size_t len, uint64_t off, ct_err *err) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t r = pread(z->fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return ct_err_set(err, CT_EIO, "%s: read failed at byte %llu (%s)", z->path,
                              (unsigned long long)off, strerror(errno));
        }
        if (r == 0) {
            return ct_err_set(err, CT_EINVAL, "%s: truncated at byte %llu", z->path,
                              (unsigned long long)off);
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return CT_OK;
}

typedef struct zip_dir {
    uint64_t n;
    uint64_t cd_off, cd_size;
} zip_dir;

/* Finds the end-of-central-directory record (and the ZIP64 one when present). */
static ct_status find_directory(const zip_in *z, zip_dir *dir, ct_err *err) {
    if (z->size < ZIP_END_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: not a zip file (%llu bytes, too short for the end "
                          "of central directory record)",
                          z->path, (unsigned long long)z->size);
    }
    size_t tail_len =
        (size_t)(z->size < ZIP_END_BYTES + ZIP_MAX_COMMENT ? z->size
                                                           : ZIP_END_BYTES + ZIP_MAX_COMMENT);
    unsigned char *tail = malloc(tail_len);
    if (!tail) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    uint64_t tail_off = z->size - tail_len;
    ct_status st = read_at(z, tail, tail_len, tail_off, err);
    if (st != CT_OK) {
        free(tail);
        return st;
    }
    /* The record is 22 bytes plus a comment that must reach exactly to the end of the file. */
    size_t pos = 0;
    int found = 0;
    for (size_t i = tail_len - ZIP_END_BYTES + 1; i-- > 0;) {
        if (ct__get32(tail + i) == ZIP_END_SIG &&
            i + ZIP_END_BYTES + ct__get16(tail + i + 20) == tail_len) {
            pos = i;
            found = 1;
            break;
        }
    }
    if (!found) {
        free(tail);
        return ct_err_set(err, CT_EINVAL,
                          "%s: no zip end of central directory record (not a zip "
                          "file, or truncated)",
                          z->path);
    }
    const unsigned char *e = tail + pos;
    uint64_t end_off = tail_off + pos;
    uint32_t disk = ct__get16(e + 4), cd_disk = ct__get16(e + 6);
    uint64_t n_disk = ct__get16(e + 8);
    dir->n = ct__get16(e + 10);
    dir->cd_size = ct__get32(e + 12);
    dir->cd_off = ct__get32(e + 16);
    free(tail);
    uint64_t limit = end_off; /* the directory ends where the next record starts */

    /* ZIP64: a locator just before the record points at the 64-bit record (as Python's zipfile
     * reads it, whether or not the 32-bit fields are saturated). */
    if (end_off >= ZIP64_LOCATOR_BYTES) {
        unsigned char loc[ZIP64_LOCATOR_BYTES];
        st = read_at(z, loc, sizeof loc, end_off - ZIP64_LOCATOR_BYTES, err);
        if (st != CT_OK) {
            return st;
        }
        if (ct__get32(loc) == ZIP64_LOCATOR_SIG) {
            uint64_t z64_off = ct__get64(loc + 8);
            uint64_t loc_off = end_off - ZIP64_LOCATOR_BYTES;
            if (ct__get32(loc + 4) != 0 || ct__get32(loc + 16) > 1 || z64_off > loc_off ||
                loc_off - z64_off < ZIP64_END_BYTES) {
                return ct_err_set(err, CT_EINVAL,
                                  "%s: byte %llu: bad ZIP64 end of central "
                                  "directory locator",
                                  z->path, (unsigned long long)loc_off);
            }
            unsigned char r[ZIP64_END_BYTES];
            st = read_at(z, r, sizeof r, z64_off, err);
            if (st != CT_OK) {
                return st;
            }
            if (ct__get32(r) != ZIP64_END_SIG) {
                return ct_err_set(err, CT_EINVAL,
                                  "%s: byte %llu: bad ZIP64 end of central "
                                  "directory signature",
                                  z->path, (unsigned long long)z64_off);
            }
            disk = ct__get32(r + 16);
            cd_disk = ct__get32(r + 20);
            n_disk = ct__get64(r + 24);
            dir->n = ct__get64(r + 32);
            dir->cd_size = ct__get64(r + 40);
            dir->cd_off = ct__get64(r + 48);
            limit = z64_off;
        }
    }
    if (disk != 0 || cd_disk != 0 || n_disk != dir->n) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: byte %llu: multi-disk zip archives are not "
                          "supported",
                          z->path, (unsigned long long)end_off);
    }
    if (dir->cd_off > limit || dir->cd_size > limit - dir->cd_off) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: central directory (%llu bytes at byte %llu) runs "
                          "past its end record at byte %llu (truncated or corrupt)",
                          z->path, (unsigned long long)dir->cd_size,
                          (unsigned long long)dir->cd_off, (unsigned long long)limit);
    }
    if (dir->n > dir->cd_size / ZIP_CENTRAL_BYTES || dir->n > INT_MAX / 2) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: end record claims %llu members, more than a "
                          "%llu-byte central directory holds",
                          z->path, (unsigned long long)dir->n, (unsigned long long)dir->cd_size);
    }
    return CT_OK;
}

/* One central directory entry, its 64-bit fields resolved. */
typedef struct zip_entry {
    const unsigned char *name;
    size_t name_len;
    uint32_t flags, method, crc;
    uint64_t csize, usize, local_off;
    char shown[160]; /* printable name for messages */
} zip_entry;

/* Parses the entry at cd[*pos]; advances *pos. */
static ct_status parse_entry(const zip_in *z, const zip_dir *dir, const unsigned char *cd,
                             size_t *pos, zip_entry *e, ct_err *err) {
    size_t p = *pos;
    unsigned long long at = (unsigned long long)(dir->cd_off + p);
    if (dir->cd_size - p < ZIP_CENTRAL_BYTES || ct__get32(cd + p) != ZIP_CENTRAL_SIG) {
        return ct_err_set(err, CT_EINVAL, "%s: byte %llu: bad central directory entry signature",
                          z->path, at);
    }
    const unsigned char *c = cd + p;
    e->flags = ct__get16(c + 8);
    e->method = ct__get16(c + 10);
    e->crc = ct__get32(c + 16);
    e->csize = ct__get32(c + 20);
    e->usize = ct__get32(c + 24);
    e->name_len = ct__get16(c + 28);
    size_t extra_len = ct__get16(c + 30), comment_len = ct__get16(c + 32);
    uint32_t disk = ct__get16(c + 34);
    e->local_off = ct__get32(c + 42);
    if (dir->cd_size - p - ZIP_CENTRAL_BYTES < e->name_len + extra_len + comment_len) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: byte %llu: central directory entry runs past the "
                          "directory",
                          z->path, at);
    }
    e->name = c + ZIP_CENTRAL_BYTES;
    printable_name(e->name, e->name_len, e->shown, sizeof e->shown);
    /* ZIP64 extra field: 8-byte values for exactly the fields saturated above, in this order. */
    const unsigned char *x = e->name + e->name_len, *x_end = x + extra_len;
    while (x_end - x >= 4) {
        uint32_t id = ct__get16(x), sz = ct__get16(x + 2);
        if ((size_t)(x_end - x - 4) < sz) {
            return ct_err_set(err, CT_EINVAL, "%s: member '%s': extra field runs past its entry",
                              z->path, e->shown);
        }
        if (id == 1) {
            const unsigned char *v = x + 4, *v_end = v + sz;
            uint64_t *fields[3] = {&e->usize, &e->csize, &e->local_off};
            for (int f = 0; f < 3; f++) {
                if (*fields[f] == ZIP_U32_MAX) {
                    if (v_end - v < 8) {
                        return ct_err_set(err, CT_EINVAL,
                                          "%s: member '%s': ZIP64 extra field "
                                          "too short",
                                          z->path, e->shown);
                    }
                    *fields[f] = ct__get64(v);
                    v += 8;
                }
            }
            if (disk == 0xFFFF && v_end - v >= 4) {
                disk = ct__get32(v);
            }
        }
        x += 4 + sz;
    }
    if (disk != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': on disk %u (multi-disk zip archives "
                          "are not supported)",
                          z->path, e->shown, disk);
    }
    *pos = p + ZIP_CENTRAL_BYTES + e->name_len + extra_len + comment_len;
    return CT_OK;
}

/* Inflates raw deflate data `in` into exactly `out_len` bytes. */
static ct_status inflate_member(const zip_in *z, const zip_entry *e, const unsigned char *in,
                                unsigned char *out, ct_err *err) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': cannot start zlib", z->path, e->shown);
    }
    uint64_t in_left = e->csize, out_left = e->usize;
    zs.next_in = (unsigned char *)in;
    zs.next_out = out;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (zs.avail_in == 0 && in_left > 0) {
            zs.avail_in = (uInt)(in_left < CT__ZLIB_CHUNK ? in_left : CT__ZLIB_CHUNK);
            in_left -= zs.avail_in;
        }
        if (zs.avail_out == 0 && out_left > 0) {
            zs.avail_out = (uInt)(out_left < CT__ZLIB_CHUNK ? out_left : CT__ZLIB_CHUNK);
            out_left -= zs.avail_out;
        }
        rc = inflate(&zs, Z_NO_FLUSH);
    }
    uint64_t produced = e->usize - out_left - zs.avail_out;
    const char *why = zs.msg ? zs.msg : "corrupt data";
    char zmsg[128];
    snprintf(zmsg, sizeof zmsg, "%s", why);
    inflateEnd(&zs);
    if (rc == Z_MEM_ERROR) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': zlib out of memory", z->path, e->shown);
    }
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': bad deflate data (%s)", z->path,
                          e->shown, zmsg);
    }
    if (rc == Z_STREAM_END && produced == e->usize) {
        return CT_OK;
    }
    if (rc == Z_STREAM_END) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': inflates to %llu bytes, the "
                          "directory says %llu",
                          z->path, e->shown, (unsigned long long)produced,
                          (unsigned long long)e->usize);
    }
    if (produced == e->usize) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': inflates to more than the %llu bytes "
                          "the directory says",
                          z->path, e->shown, (unsigned long long)e->usize);
    }
    return ct_err_set(err, CT_EINVAL,
                      "%s: member '%s': deflate stream truncated after %llu "
                      "bytes",
                      z->path, e->shown, (unsigned long long)produced);
}
static ct_status read_member(const zip_in *z, const zip_dir *dir, const zip_entry *e,
                             ct_named_array *a, void **owner, ct_err *err) {
    if (e->flags & 0x41) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': encrypted members are not supported",
                          z->path, e->shown);
    }
    if (e->method != 0 && e->method != 8) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': compression method %u is not "
                          "supported (stored or deflate)",
                          z->path, e->shown, e->method);
    }
    size_t key_len = e->name_len;
    if (key_len >= 4 && memcmp(e->name + key_len - 4, ".npy", 4) == 0) {
        key_len -= 4;
    }
    if (key_len >= sizeof a->name || memchr(e->name, '\0', e->name_len)) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': name longer than %d bytes or with a "
                          "NUL",
                          z->path, e->shown, CT_NPZ_MAX_NAME - 1);
    }
    memcpy(a->name, e->name, key_len);
    a->name[key_len] = '\0';

    /* Members lie before the central directory; the local header's own sizes may be ZIP64
     * placeholders, so only its method, name and extra length are used. */
    uint64_t limit = dir->cd_off;
    if (e->local_off > limit || limit - e->local_off < ZIP_LOCAL_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': local header offset %llu is past the "
                          "central directory at %llu",
                          z->path, e->shown, (unsigned long long)e->local_off,
                          (unsigned long long)limit);
    }
    unsigned char lh[ZIP_LOCAL_BYTES];
    ct_status st = read_at(z, lh, sizeof lh, e->local_off, err);
    if (st != CT_OK) {
        return st;
    }
    if (ct__get32(lh) != ZIP_LOCAL_SIG) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': byte %llu: bad local header "
                          "signature",
                          z->path, e->shown, (unsigned long long)e->local_off);
    }
    uint64_t lname_len = ct__get16(lh + 26), lextra_len = ct__get16(lh + 28);
    uint64_t name_off = e->local_off + ZIP_LOCAL_BYTES;
    uint64_t data_off = name_off + lname_len + lextra_len;
    if (lname_len != e->name_len || ct__get16(lh + 8) != e->method || data_off > limit ||
        e->csize > limit - data_off) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': byte %llu: local header disagrees "
                          "with the central directory, or the data runs past it",
                          z->path, e->shown, (unsigned long long)e->local_off);
    }
    if (e->method == 0 && e->csize != e->usize) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': stored member with sizes %llu and "
                          "%llu",
                          z->path, e->shown, (unsigned long long)e->csize,
                          (unsigned long long)e->usize);
    }
    if (e->method == 8 && e->usize / DEFLATE_MAX_RATIO > e->csize + 1) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': claims %llu bytes inflated from %llu:"
                          " more than deflate can produce",
                          z->path, e->shown, (unsigned long long)e->usize,
                          (unsigned long long)e->csize);
    }
    if (e->usize > SIZE_MAX - 16 || e->csize > SIZE_MAX - 16) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': too large for memory", z->path,
                          e->shown);
    }
    unsigned char *raw = malloc((size_t)e->csize + (size_t)lname_len + 1);
    if (!raw) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': out of memory (%llu bytes)", z->path,
                          e->shown, (unsigned long long)e->csize);
    }
    st = read_at(z, raw, (size_t)lname_len, name_off, err);
    if (st == CT_OK && memcmp(raw, e->name, e->name_len) != 0) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': byte %llu: local header name differs "
                        "from the central directory",
                        z->path, e->shown, (unsigned long long)name_off);
    }
    st = st == CT_OK ? read_at(z, raw, (size_t)e->csize, data_off, err) : st;
    unsigned char *data = raw;
    if (st == CT_OK && e->method == 8) {
        data = malloc((size_t)e->usize + 1);
        if (!data) {
            st = ct_err_set(err, CT_ENOMEM, "%s: member '%s': out of memory (%llu bytes)", z->path,
                            e->shown, (unsigned long long)e->usize);
        } else {
            st = inflate_member(z, e, raw, data, err);
        }
        free(raw);
    }
    if (st == CT_OK && ct__zip_crc32(0, data, (size_t)e->usize) != e->crc) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': CRC mismatch (corrupt data)", z->path,
                        e->shown);
    }
    if (st != CT_OK) {
        free(data);
        return st;
    }
    return ct__npy_decode(z->path, e->shown, data, (size_t)e->usize, a, owner, err);
}

static int cmp_array_name(const void *a, const void *b) {
    return strcmp((*(const ct_named_array *const *)a)->name,
                  (*(const ct_named_array *const *)b)->name);
}

static ct_status read_all(const zip_in *z, ct_npz *out, ct_err *err) {
    zip_dir dir = {0};
    ct_status st = find_directory(z, &dir, err);
    if (st != CT_OK) {
        return st;
    }
    unsigned char *cd = malloc((size_t)dir.cd_size + 1);
    size_t count = (size_t)(dir.n > 0 ? dir.n : 1);
    out->arrays = calloc(count, sizeof *out->arrays);
    out->bufs = calloc(count, sizeof *out->bufs);
    if (!cd || !out->arrays || !out->bufs) {
        free(cd);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    st = read_at(z, cd, (size_t)dir.cd_size, dir.cd_off, err);
    size_t pos = 0;
    for (uint64_t i = 0; i < dir.n && st == CT_OK; i++) {
        zip_entry e;
        st = parse_entry(z, &dir, cd, &pos, &e, err);
        if (st == CT_OK) {
            st = read_member(z, &dir, &e, &out->arrays[i], &out->bufs[i], err);
        }
        out->n += st == CT_OK;
    }
    free(cd);
    if (st != CT_OK) {
        return st;
    }
    const ct_named_array **sorted = malloc(sizeof *sorted * count);
    if (!sorted) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    for (int i = 0; i < out->n; i++) {
        sorted[i] = &out->arrays[i];
    }
    qsort(sorted, (size_t)out->n, sizeof *sorted, cmp_array_name);
    for (int i = 1; i < out->n && st == CT_OK; i++) {
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            char shown[160];
            printable_name((const unsigned char *)sorted[i]->name, strlen(sorted[i]->name), shown,
                           sizeof shown);
            st = ct_err_set(err, CT_EINVAL, "%s: two members named '%s'", z->path, shown);
        }
    }
    free(sorted);
    return st;
}

ct_status ct_npz_create(const char *path, ct_npz **ret, ct_err *err) {
    if (!path || !ret) {
        return ct_err_set(err, CT_EINVAL, "ct_npz_create: NULL argument");
    }
    *ret = NULL;
    zip_in z = {.path = path, .fd = open(path, O_RDONLY | O_CLOEXEC)};
    if (z.fd < 0) {
        int e = errno;
        return ct_err_set(err, e == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open (%s)", path,
                          strerror(e));
    }
    struct stat sb;
    if (fstat(z.fd, &sb) != 0) {
        int e = errno;
        close(z.fd);
        return ct_err_set(err, CT_EIO, "%s: cannot stat (%s)", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(z.fd);
        return ct_err_set(err, CT_EINVAL, "%s: not a regular file", path);
    }
    z.size = (uint64_t)sb.st_size;
    ct_npz *out = calloc(1, sizeof *out);
    if (!out) {
        close(z.fd);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_status st = read_all(&z, out, err);
    close(z.fd);
    if (st != CT_OK) {
        ct_npz_destroy(out);
        return st;
    }
    *ret = out;
    return CT_OK;
}

int ct_npz_count(const ct_npz *z) {
    return z ? z->n : 0;
}

const ct_named_array *ct_npz_get(const ct_npz *z, int i) {
    return (z && i >= 0 && i < z->n) ? &z->arrays[i] : NULL;
}

const ct_named_array *ct_npz_find(const ct_npz *z, const char *name) {
    for (int i = 0; z && name && i < z->n; i++) {
        if (strcmp(z->arrays[i].name, name) == 0) {
            return &z->arrays[i];
        }
    }
    return NULL;
}

void ct_npz_destroy(ct_npz *z) {
    if (!z) {
        return;
    }
    if (z->bufs) {
        for (int i = 0; i < z->n; i++) {
            free(z->bufs[i]);
        }
    }
    free(z->bufs);
    free(z->arrays);
    free(z);
}
