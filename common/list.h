/* list.h - intrusive circular doubly linked list (O(1) insert and remove).
 *
 * Embed a list_node_t in a struct and recover it with LIST_ENTRY. A list
 * head is a node whose next/prev point to itself when empty.
 *
 * Thread: not synchronized; the owner's thread only.
 */
#ifndef COMMON_LIST_H
#define COMMON_LIST_H

#include <stddef.h>

typedef struct list_node {
    struct list_node *next;
    struct list_node *prev;
} list_node_t;

#define LIST_ENTRY(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

static inline void
list_init(list_node_t *h)
{
    h->next = h;
    h->prev = h;
}

static inline int
list_empty(const list_node_t *h)
{
    return h->next == h;
}

static inline void
list_insert_before(list_node_t *pos, list_node_t *n)
{
    n->prev = pos->prev;
    n->next = pos;
    pos->prev->next = n;
    pos->prev = n;
}

static inline void
list_push_back(list_node_t *h, list_node_t *n)
{
    list_insert_before(h, n);
}

static inline void
list_push_front(list_node_t *h, list_node_t *n)
{
    list_insert_before(h->next, n);
}

static inline void
list_remove(list_node_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n;
    n->prev = n;
}

#define LIST_FOREACH(it, head) for ((it) = (head)->next; (it) != (head); (it) = (it)->next)
#define LIST_FOREACH_SAFE(it, tmp, head)                                    \
    for ((it) = (head)->next, (tmp) = (it)->next; (it) != (head);           \
         (it) = (tmp), (tmp) = (it)->next)

#endif /* COMMON_LIST_H */
