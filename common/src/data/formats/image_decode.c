/* JPEG and PNG decoding for the image sources (image_decode.h). libjpeg reports errors through
 * a callback that must not return, so the decoder jumps back with longjmp to one setjmp per
 * image and returns CT_EFORMAT; its message callbacks are replaced so that nothing is printed,
 * and a warning (corrupt or truncated data, which libjpeg would otherwise paper over with
 * grey) is an error too. PNG goes through libpng's simplified png_image API, which does the
 * setjmp itself and leaves the message in the png_image. */
#include "data/formats/image_decode.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

/* Larger images are refused: a corrupt header must not make the decoder ask for gigabytes. */
#define IMAGE_MAX_BYTES ((size_t)1 << 30)

static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* ---- JPEG ---- */

typedef struct jpeg_fail {
    struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    int too_large; /* set by jpeg_run; here, not a local, so longjmp cannot clobber it */
} jpeg_fail;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_fail *fail = (jpeg_fail *)cinfo->err;
    cinfo->err->format_message(cinfo, fail->msg);
    longjmp(fail->jump, 1);
}

static void jpeg_on_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: the data is corrupt */
        jpeg_on_error(cinfo);
    }
}

static void jpeg_silent(j_common_ptr cinfo) {
    (void)cinfo;
}

/* The part of a JPEG decode that may longjmp back to ct__image_decode's setjmp. */
static void jpeg_run(struct jpeg_decompress_struct *cinfo, const unsigned char *data, size_t n,
                     int channels, ct_element *ret, int i, int *ret_too_large) {
    jpeg_mem_src(cinfo, data, (unsigned long)n);
    jpeg_read_header(cinfo, TRUE);
    int want = channels ? channels : cinfo->num_components == 1 ? 1 : 3;
    cinfo->out_color_space = want == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(cinfo);
    size_t row = (size_t)cinfo->output_width * (size_t)want;
    ct_shape shape = {.rank = 3, .dims = {cinfo->output_height, cinfo->output_width, want}};
    if (row * cinfo->output_height > IMAGE_MAX_BYTES) {
        *ret_too_large = 1;
        return;
    }
    if (ct_element_alloc(ret, i, CT_U8, &shape, 0) != CT_OK) {
        return; /* ret->v[i].data stays NULL */
    }
    unsigned char *pixels = ret->v[i].data;
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW rows[1] = {pixels + row * cinfo->output_scanline};
        jpeg_read_scanlines(cinfo, rows, 1);
    }
    jpeg_finish_decompress(cinfo);
}

static ct_status decode_jpeg(const char *path, const unsigned char *data, size_t n, int channels,
                             ct_element *ret, int i, ct_err *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_fail fail;
    fail.too_large = 0;
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = jpeg_on_error;
    fail.mgr.emit_message = jpeg_on_message;
    fail.mgr.output_message = jpeg_silent;
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return ct_err_set(err, CT_EFORMAT, "%s: cannot decode JPEG: %s", path, fail.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_run(&cinfo, data, n, channels, ret, i, &fail.too_large);
    jpeg_destroy_decompress(&cinfo);
    if (fail.too_large) {
        return ct_err_set(err, CT_EFORMAT, "%s: JPEG image too large (over %zu bytes decoded)",
                          path, IMAGE_MAX_BYTES);
    }
    if (i >= ret->n || ret->v[i].data == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for the decoded image", path);
    }
    return CT_OK;
}

/* ---- PNG ---- */

static ct_status decode_png(const char *path, const unsigned char *data, size_t n, int channels,
                            ct_element *ret, int i, ct_err *err) {
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, data, n)) {
        return ct_err_set(err, CT_EFORMAT, "%s: cannot decode PNG: %s", path, image.message);
    }
    int want = channels ? channels : (image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
    image.format = want == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    ct_shape shape = {.rank = 3, .dims = {image.height, image.width, want}};
    if (PNG_IMAGE_SIZE(image) > IMAGE_MAX_BYTES) {
        png_image_free(&image);
        return ct_err_set(err, CT_EFORMAT, "%s: PNG image too large (%ux%u)", path, image.width,
                          image.height);
    }
    if (ct_element_alloc(ret, i, CT_U8, &shape, 0) != CT_OK) {
        png_image_free(&image);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for the decoded image", path);
    }
    if (!png_image_finish_read(&image, NULL, ret->v[i].data, 0, NULL)) {
        png_image_free(&image);
        return ct_err_set(err, CT_EFORMAT, "%s: cannot decode PNG: %s", path, image.message);
    }
    return CT_OK;
}

ct_status ct__image_decode(const char *path, const unsigned char *data, size_t n, int channels,
                           ct_element *ret, int i, ct_err *err) {
    if (n >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
        return decode_jpeg(path, data, n, channels, ret, i, err);
    }
    if (n >= sizeof png_magic && memcmp(data, png_magic, sizeof png_magic) == 0) {
        return decode_png(path, data, n, channels, ret, i, err);
    }
    return ct_err_set(err, CT_EFORMAT, "%s: not a JPEG or PNG file", path);
}
