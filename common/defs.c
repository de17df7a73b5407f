/*
 * defs.c - the name tables of defs.h, and the compile-time checks that the
 * tandem.v1 proto enums number the lists in their order.
 */
#include "defs.h"

#include "tandem/v1/common.pb-c.h"

#include <stddef.h>
#include <string.h>

#define NAME(e, n, served) n,

static const char *const role_names[] = {"unspecified", TDM_ROLES(NAME)};
static const char *const strategy_names[] = {"unspecified", TDM_STATE_STRATEGIES(NAME)};
static const char *const backend_names[] = {"unspecified", TDM_BACKENDS(NAME)};
static const char *const kind_names[] = {"unspecified", TDM_DRAFTER_KINDS(NAME)};

/* Each list entry's proto value is its position from 1. */
#define POS(e, n, served) POS_##e,
enum { POS_ROLE_0, TDM_ROLES(POS) };
enum { POS_STRATEGY_0, TDM_STATE_STRATEGIES(POS) };
enum { POS_KIND_0, TDM_DRAFTER_KINDS(POS) };
#define CHECK(proto, e, n, served) _Static_assert((int)proto##e == (int)POS_##e, "proto enum order: " n);
#define CHECK_ROLE(e, n, served) CHECK(TANDEM__V1__ROLE__ROLE_, e, n, served)
#define CHECK_STRATEGY(e, n, served)                                                               \
    CHECK(TANDEM__V1__STATE_STRATEGY__STATE_STRATEGY_, e, n, served)                              \
    _Static_assert((int)TDM_STATE_##e + 1 == (int)POS_##e, "engine enum order: " n);
#define CHECK_KIND(e, n, served) CHECK(TANDEM__V1__DRAFTER_KIND__DRAFTER_KIND_, e, n, served)
TDM_ROLES(CHECK_ROLE)
TDM_STATE_STRATEGIES(CHECK_STRATEGY)
TDM_DRAFTER_KINDS(CHECK_KIND)

static const char *name_at(const char *const *names, size_t n, int v)
{
    return v > 0 && (size_t)v < n ? names[v] : names[0];
}

static int parse_in(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 1; s && i < n; i++)
        if (strcmp(names[i], s) == 0)
            return (int)i;
    return 0;
}

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

const char *tdm_role_name(int v)
{
    return name_at(role_names, LEN(role_names), v);
}

const char *tdm_drafter_kind_name(int v)
{
    return name_at(kind_names, LEN(kind_names), v);
}

int tdm_drafter_kind_parse(const char *s)
{
    return parse_in(kind_names, LEN(kind_names), s);
}

const char *tdm_state_strategy_name(tdm_state_strategy st)
{
    return name_at(strategy_names, LEN(strategy_names), (int)st + 1);
}

int tdm_state_strategy_parse(const char *s)
{
    return parse_in(strategy_names, LEN(strategy_names), s) - 1;
}

int tdm_state_strategy_from_proto(int v)
{
    return v > 0 && (size_t)v < LEN(strategy_names) ? v - 1 : -1;
}

const char *tdm_backend_kind_name(tdm_backend_kind b)
{
    return name_at(backend_names, LEN(backend_names), (int)b + 1);
}

int tdm_backend_kind_parse(const char *s)
{
    return parse_in(backend_names, LEN(backend_names), s) - 1;
}
