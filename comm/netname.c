/* netname.c - see netname.h. */
#include <netdb.h>
#include <stdbool.h>
#include <stddef.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "netname.h"

bool gw__addr_needs_zone(const char *host)
{
    struct in6_addr a;
    return inet_pton(AF_INET6, host, &a) == 1 && IN6_IS_ADDR_LINKLOCAL(&a);
}

bool gw__name_is_loopback(const char *host, char *out, size_t outsz)
{
    if (outsz)
        out[0] = '\0';
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0) {
        freeaddrinfo(ai);
        return false;
    }
    hints.ai_flags = 0;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return false; /* not resolvable now: the rendezvous retries and says so */
    bool all = ai != NULL;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        bool lo = false;
        if (a->ai_family == AF_INET)
            lo = (ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            lo = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
        if (a == ai)
            getnameinfo(a->ai_addr, a->ai_addrlen, out, (socklen_t)outsz, NULL, 0, NI_NUMERICHOST);
        all = all && lo;
    }
    freeaddrinfo(ai);
    return all;
}
