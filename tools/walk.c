/* Directory walk beneath the workspace: ignore files per directory, no symlinks followed,
 * optionally spread over worker threads (a shared stack of directories). */
#include "tool_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ig_node {
    tool_ignore *ig;
    struct ig_node *parent;
    struct ig_node *all_next;   /* every node, for freeing */
} ig_node;

typedef struct dir_task {
    char *rel;          /* "." for the workspace root */
    int fd;
    int depth;
    ig_node *ig;
    struct dir_task *next;
} dir_task;

typedef struct {
    tool_ctx *ctx;
    const tool_walk_opts *o;
    tool_walk_fn fn;
    void *user;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dir_task *stack;
    int pending;        /* tasks queued or being processed */
    int rc;             /* first error */
    volatile int stop;
    ig_node *all;
} walker;

typedef struct {
    char *name;
    bool is_dir;
} dent;

static int dent_cmp(const void *a, const void *b) {
    return strcmp(((const dent *)a)->name, ((const dent *)b)->name);
}

static bool stopped(walker *w) {
    return w->stop || (w->o->stop && *w->o->stop);
}

static void set_rc(walker *w, int rc) {
    pthread_mutex_lock(&w->mu);
    if (!w->rc) w->rc = rc;
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Read .gitignore and .ignore of an open directory into a new node (or return parent). */
static int load_ignores(walker *w, int dfd, const char *rel, ig_node *parent, ig_node **out) {
    *out = parent;
    static const char *const names[] = {".gitignore", ".ignore"};
    for (int i = 0; i < 2; i++) {
        int fd = openat(dfd, names[i], O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        char *text;
        size_t len;
        int rc = tool_fd_read_all(fd, 1 << 20, &text, &len);
        close(fd);
        if (rc < 0) continue; /* an unreadable or huge ignore file is skipped */
        tool_ignore *ig;
        rc = tool_ignore_parse(&ig, rel, text, len);
        free(text);
        if (rc < 0) return rc;
        ig_node *n = calloc(1, sizeof *n);
        if (!n) {
            tool_ignore_free(ig);
            return tool_err(TOOL_ENOMEM, "out of memory");
        }
        n->ig = ig;
        n->parent = *out;
        pthread_mutex_lock(&w->mu);
        n->all_next = w->all;
        w->all = n;
        pthread_mutex_unlock(&w->mu);
        *out = n;
    }
    return 0;
}

static bool is_ignored(const ig_node *n, const char *rel, bool is_dir) {
    for (; n; n = n->parent) {
        int v = tool_ignore_check(n->ig, rel, is_dir);
        if (v) return v > 0;
    }
    return false;
}

static char *join(const char *dir, const char *name) {
    if (!strcmp(dir, ".")) return strdup(name);
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

static void push_task(walker *w, dir_task *t) {
    pthread_mutex_lock(&w->mu);
    t->next = w->stack;
    w->stack = t;
    w->pending++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int process_dir(walker *w, dir_task *t, int worker, bool serial);

static int process_dir(walker *w, dir_task *t, int worker, bool serial) {
    int rc = 0;
    DIR *d = fdopendir(t->fd);
    if (!d) {
        close(t->fd);
        return 0; /* unreadable directory: skipped, like rg */
    }
    int dfd = dirfd(d);
    ig_node *ig = t->ig;
    if (!w->o->no_ignore && (rc = load_ignores(w, dfd, t->rel, t->ig, &ig)) < 0) {
        closedir(d);
        return rc;
    }
    dent *ents = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) continue;
        if (!strcmp(nm, ".git")) continue;
        if (nm[0] == '.' && !w->o->hidden) continue;
        unsigned char ty = de->d_type;
        if (ty == DT_UNKNOWN) {
            struct stat st;
            if (fstatat(dfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
            ty = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_LNK;
        }
        if (ty != DT_DIR && ty != DT_REG) continue; /* symlinks, devices, sockets */
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            dent *ne = realloc(ents, nc * sizeof *ne);
            if (!ne) {
                rc = tool_err(TOOL_ENOMEM, "out of memory");
                goto done;
            }
            ents = ne;
            cap = nc;
        }
        ents[n].name = strdup(nm);
        if (!ents[n].name) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        ents[n++].is_dir = ty == DT_DIR;
    }
    if (serial) qsort(ents, n, sizeof *ents, dent_cmp);
    for (size_t i = 0; i < n && !stopped(w); i++) {
        char *rel = join(t->rel, ents[i].name);
        if (!rel) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            break;
        }
        if (ig && is_ignored(ig, rel, ents[i].is_dir)) {
            free(rel);
            continue;
        }
        tool_walk_entry e = {rel, dfd, ents[i].name, ents[i].is_dir, t->depth + 1};
        int v = w->fn(w->user, &e, worker);
        if (v < 0) {
            free(rel);
            rc = v;
            break;
        }
        bool descend = ents[i].is_dir && v == 0 &&
                       (w->o->max_depth <= 0 || t->depth + 1 < w->o->max_depth);
        if (!descend) {
            free(rel);
            continue;
        }
        int cfd = openat(dfd, ents[i].name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (cfd < 0) {
            free(rel);
            continue;
        }
        dir_task *ct = calloc(1, sizeof *ct);
        if (!ct) {
            close(cfd);
            free(rel);
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            break;
        }
        ct->rel = rel;
        ct->fd = cfd;
        ct->depth = t->depth + 1;
        ct->ig = ig;
        if (serial) {
            rc = process_dir(w, ct, worker, true);
            free(ct->rel);
            free(ct);
            if (rc < 0) break;
        } else {
            push_task(w, ct);
        }
    }
done:
    for (size_t i = 0; i < n; i++) free(ents[i].name);
    free(ents);
    closedir(d);
    return rc;
}

typedef struct {
    walker *w;
    int id;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *a = p;
    walker *w = a->w;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->stack && w->pending > 0 && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->stack || w->stop) {
            pthread_cond_broadcast(&w->cv);
            pthread_mutex_unlock(&w->mu);
            break;
        }
        dir_task *t = w->stack;
        w->stack = t->next;
        pthread_mutex_unlock(&w->mu);
        int rc = process_dir(w, t, a->id, false);
        free(t->rel);
        free(t);
        if (rc < 0) set_rc(w, rc);
        pthread_mutex_lock(&w->mu);
        if (--w->pending == 0) pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

int tool_walk(tool_ctx *ctx, const tool_walk_opts *o, tool_walk_fn fn, void *user) {
    walker w;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    w.o = o;
    w.fn = fn;
    w.user = user;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    int rc = 0;
    const char *start = o->start_rel ? o->start_rel : ".";
    /* Ignore rules of the ancestors of the start directory, root first. */
    ig_node *chain = NULL;
    if (!o->no_ignore && strcmp(start, ".") != 0) {
        size_t sl = strlen(start);
        char *prefix = malloc(sl + 1);
        if (!prefix) {
            rc = tool_err(TOOL_ENOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i <= sl && rc == 0; i++) {
            if (i && i < sl && start[i] != '/') continue;
            if (i == sl) break; /* the start directory reads its own in process_dir */
            memcpy(prefix, start, i);
            prefix[i] = '\0';
            const char *dir = i ? prefix : ".";
            int dfd = tool_path_open(ctx, dir, O_RDONLY | O_DIRECTORY, 0, false);
            if (dfd < 0) continue;
            rc = load_ignores(&w, dfd, i ? prefix : "", chain, &chain);
            close(dfd);
        }
        free(prefix);
        if (rc < 0) goto done;
    }
    int fd = tool_path_open(ctx, start, O_RDONLY | O_DIRECTORY, 0, false);
    if (fd < 0) {
        rc = fd;
        goto done;
    }
    dir_task *root = calloc(1, sizeof *root);
    if (!root || !(root->rel = strdup(start))) {
        free(root);
        close(fd);
        rc = tool_err(TOOL_ENOMEM, "out of memory");
        goto done;
    }
    root->fd = fd;
    root->ig = chain;
    int nthreads = o->threads > 0 ? o->threads : 1;
    if (nthreads == 1) {
        rc = process_dir(&w, root, 0, true);
        free(root->rel);
        free(root);
    } else {
        push_task(&w, root);
        pthread_t th[64];
        worker_arg args[64];
        if (nthreads > 64) nthreads = 64;
        int started = 0;
        for (int i = 0; i < nthreads; i++) {
            args[i].w = &w;
            args[i].id = i;
            if (pthread_create(&th[i], NULL, worker_main, &args[i]) != 0) break;
            started++;
        }
        if (!started) {
            args[0].w = &w;
            args[0].id = 0;
            worker_main(&args[0]);
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        while (w.stack) { /* left over after a stop */
            dir_task *t = w.stack;
            w.stack = t->next;
            close(t->fd);
            free(t->rel);
            free(t);
        }
        rc = w.rc;
    }
done:
    while (w.all) {
        ig_node *n = w.all;
        w.all = n->all_next;
        tool_ignore_free(n->ig);
        free(n);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}
