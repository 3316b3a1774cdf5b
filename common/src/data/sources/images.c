/* Image sources: a list of JPEG or PNG files (ct_dataset_images), and Keras's
 * image_dataset_from_directory layout (ct_dataset_image_folder: one sub-folder per class).
 * Element i reads and decodes file i (image_decode.c), so the source is random-access and skip
 * is O(1); images differ in size, so the spec's height and width are unknown (-1). Files are
 * read when their element is asked for, never at creation: the file list is the dataset. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"
#include "data/formats/image_decode.h"

typedef struct images_params {
    char **paths;
    int n;
    int32_t *labels; /* NULL: no label component */
    int channels;    /* 0: as stored */
} images_params;

static void images_free(void *params) {
    images_params *p = params;
    if (p != NULL) {
        free(p->paths);
        free(p->labels);
    }
    free(p);
}

static ct_status images_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                            ct_err *err) {
    (void)epoch;
    const images_params *p = ds->params;
    if (index < 0 || index >= p->n) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %d)", ds->name,
                          (long long)index, p->n);
    }
    const char *path = p->paths[index];
    unsigned char *data = NULL;
    size_t n = 0;
    ct_status st = ct__file_read_all(path, &data, &n, err);
    if (st == CT_OK) {
        st = ct__image_decode(path, data, n, p->channels, ret, 0, err);
    }
    free(data);
    ct_shape scalar = {.rank = 0};
    if (st == CT_OK && p->labels != NULL) {
        st = ct_element_alloc(ret, 1, CT_I32, &scalar, 0);
        if (st != CT_OK) {
            ct_err_set(err, st, "%s: out of memory", path);
        } else {
            *(int32_t *)ret->v[1].data = p->labels[index];
        }
    }
    if (st != CT_OK) {
        ct_element_clear(ret);
        return st;
    }
    ret->key = (uint64_t)index;
    return CT_OK;
}

static void images_describe(const ct_dataset *ds, char *buf, size_t size) {
    const images_params *p = ds->params;
    snprintf(buf, size, "%s%s, channels=%d%s", p->paths[0], p->n > 1 ? ", ..." : "", p->channels,
             p->labels ? ", labelled" : "");
}

static const ct__dataset_ops images_ops = {
    .kind = "images",
    .make_iter = ct__cursor_make_iter,
    .get = images_get,
    .describe = images_describe,
    .free_params = images_free,
};

/* Builds the dataset over owned paths (a ct__paths_copy block) and labels (or NULL). */
static ct_status images_create(images_params *p, ct_dataset **ret, ct_err *err) {
    uint64_t h = ct__paths_fingerprint((uint64_t)p->channels, p->paths, p->n);
    for (int i = 0; p->labels != NULL && i < p->n; i++) {
        h = ct__mix64(h, (uint64_t)(uint32_t)p->labels[i]);
    }
    int n = p->n, labelled = p->labels != NULL;
    ct_value_spec image = {
        .dtype = CT_U8, .rank = 3, .dims = {-1, -1, p->channels ? p->channels : -1}};
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&images_ops, p, h, NULL, 0, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = n;
    ds->random_access = 1;
    ds->spec = (ct_element_spec){.n = 1 + labelled, .v = {image, {.dtype = CT_I32, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "images(%d files)", n);
    *ret = ds;
    return CT_OK;
}

static ct_status check_channels(int channels, ct_dataset **ret, ct_err *err) {
    if (ret == NULL || (channels != 0 && channels != 1 && channels != 3)) {
        return ct_err_set(err, CT_EINVAL, "images: channels must be 0 (as stored), 1 or 3");
    }
    return CT_OK;
}

ct_status ct_dataset_images(const char *const *paths, int n_paths, const int32_t *labels,
                            int channels, ct_dataset **ret, ct_err *err) {
    ct_status st = check_channels(channels, ret, err);
    images_params *p = st == CT_OK ? calloc(1, sizeof *p) : NULL;
    if (p == NULL) {
        return st != CT_OK ? st : ct_err_set(err, CT_ENOMEM, "images: out of memory");
    }
    p->n = n_paths;
    p->channels = channels;
    st = ct__source_paths("images", paths, n_paths, &p->paths, err);
    if (st == CT_OK && labels != NULL) {
        p->labels = malloc(sizeof(int32_t) * (size_t)n_paths);
        if (p->labels == NULL) {
            st = ct_err_set(err, CT_ENOMEM, "images: out of memory");
        } else {
            memcpy(p->labels, labels, sizeof(int32_t) * (size_t)n_paths);
        }
    }
    if (st != CT_OK) {
        images_free(p);
        return st;
    }
    return images_create(p, ret, err);
}

/* ---- image_folder ---- */

/* A growable list of owned strings. */
typedef struct name_list {
    char **v;
    int n, cap;
} name_list;

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->v[i]);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int names_add(name_list *l, const char *a, const char *b) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **bigger = realloc(l->v, sizeof(char *) * (size_t)cap);
        if (bigger == NULL) {
            return 0;
        }
        l->v = bigger, l->cap = cap;
    }
    size_t len = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
    char *s = malloc(len);
    if (s == NULL) {
        return 0;
    }
    snprintf(s, len, b ? "%s/%s" : "%s", a, b ? b : "");
    l->v[l->n++] = s;
    return 1;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot != NULL && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0 ||
                           strcasecmp(dot, ".png") == 0);
}

/* The names in `dir` (not starting with '.') that are folders (want_dirs) or image files,
 * sorted by strcmp. */
static ct_status list_dir(const char *dir, int want_dirs, name_list *ret, ct_err *err) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        char why[128];
        return ct_err_set(err, CT_EIO, "%s: cannot open the folder: %s", dir,
                          ct__errno_text(errno, why, sizeof why));
    }
    struct dirent *e;
    ct_status st = CT_OK;
    while (st == CT_OK && (e = readdir(d)) != NULL) {
        char path[4096];
        struct stat sb;
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path) {
            st = ct_err_set(err, CT_EINVAL, "%s/%s: path too long", dir, e->d_name);
            break;
        }
        if (e->d_name[0] == '.' || stat(path, &sb) != 0 ||
            (want_dirs ? !S_ISDIR(sb.st_mode)
                       : !S_ISREG(sb.st_mode) || !is_image_name(e->d_name))) {
            continue;
        }
        if (!names_add(ret, e->d_name, NULL)) {
            st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
        }
    }
    closedir(d);
    if (ret->n > 1) {
        qsort(ret->v, (size_t)ret->n, sizeof(char *), compare_names);
    }
    return st;
}

/* Writes "cat\ndog\n" into buf. CT_EINVAL when it does not fit. */
static ct_status write_class_names(const name_list *classes, char *buf, size_t size, ct_err *err) {
    size_t need = 1;
    for (int c = 0; c < classes->n; c++) {
        need += strlen(classes->v[c]) + 1;
    }
    if (need > size) {
        return ct_err_set(err, CT_EINVAL, "image_folder: class_names needs %zu bytes, has %zu",
                          need, size);
    }
    size_t len = 0;
    for (int c = 0; c < classes->n; c++) {
        len += (size_t)snprintf(buf + len, size - len, "%s\n", classes->v[c]);
    }
    buf[len] = '\0';
    return CT_OK;
}

/* Every image of every class folder: paths (dir/class/file) and labels. */
static ct_status collect_images(const char *dir, const name_list *classes, images_params *p,
                                ct_err *err) {
    name_list files = {0}, class_files = {0};
    ct_status st = CT_OK;
    int32_t *labels = NULL;
    for (int c = 0; st == CT_OK && c < classes->n; c++) {
        char class_dir[4096];
        int len = snprintf(class_dir, sizeof class_dir, "%s/%s", dir, classes->v[c]);
        st = len >= 0 && (size_t)len < sizeof class_dir
                 ? list_dir(class_dir, 0, &class_files, err)
                 : ct_err_set(err, CT_EINVAL, "%s/%s: path too long", dir, classes->v[c]);
        int32_t *bigger = realloc(labels, sizeof(int32_t) * (size_t)(files.n + class_files.n + 1));
        if (st == CT_OK && bigger == NULL) {
            st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
        }
        labels = bigger ? bigger : labels;
        for (int f = 0; st == CT_OK && f < class_files.n; f++) {
            labels[files.n] = c;
            if (!names_add(&files, class_dir, class_files.v[f])) {
                st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
            }
        }
        names_free(&class_files);
    }
    if (st == CT_OK && files.n == 0) {
        st = ct_err_set(err, CT_ENOENT, "%s: no .jpg, .jpeg or .png files in its class folders",
                        dir);
    }
    if (st == CT_OK) {
        p->n = files.n;
        p->paths = ct__paths_copy((const char *const *)files.v, files.n, err);
        st = p->paths == NULL ? CT_ENOMEM : CT_OK;
    }
    names_free(&files);
    p->labels = labels;
    return st;
}

ct_status ct_dataset_image_folder(const char *dir, int channels, char *class_names,
                                  size_t class_names_size, ct_dataset **ret, ct_err *err) {
    ct_status st = check_channels(channels, ret, err);
    if (st == CT_OK && dir == NULL) {
        st = ct_err_set(err, CT_EINVAL, "image_folder: dir must not be NULL");
    }
    name_list classes = {0};
    images_params *p = st == CT_OK ? calloc(1, sizeof *p) : NULL;
    if (st == CT_OK && p == NULL) {
        st = ct_err_set(err, CT_ENOMEM, "image_folder: out of memory");
    }
    if (st == CT_OK && (st = list_dir(dir, 1, &classes, err)) == CT_OK && classes.n == 0) {
        st = ct_err_set(err, CT_ENOENT, "%s: no class folders", dir);
    }
    if (st == CT_OK && class_names != NULL) {
        st = write_class_names(&classes, class_names, class_names_size, err);
    }
    if (st == CT_OK) {
        p->channels = channels;
        st = collect_images(dir, &classes, p, err);
    }
    int n_classes = classes.n;
    names_free(&classes);
    if (st != CT_OK) {
        images_free(p);
        return st;
    }
    ct_dataset *ds = NULL;
    if ((st = images_create(p, &ds, err)) != CT_OK) {
        return st; /* p was freed */
    }
    snprintf(ds->name, sizeof ds->name, "image_folder(%d classes)", n_classes);
    *ret = ds;
    return CT_OK;
}
