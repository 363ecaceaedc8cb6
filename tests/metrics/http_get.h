/* A plain HTTP/1.0 GET to 127.0.0.1 for the metrics tests (Prometheus' API,
 * a /metrics page), a free loopback port, and the text of a
 * `shardrec ... --metrics-listen` process's "metrics on HOST:PORT" line. */
#ifndef SHARDREC_TESTS_METRICS_HTTP_GET_H
#define SHARDREC_TESTS_METRICS_HTTP_GET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The body of GET path from 127.0.0.1:port with status 200 (malloc'd), or
 * NULL (not listening, another status). */
static inline char *http_get(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  char req[8192];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + len, cap - 1 - len)) > 0) {
    len += (size_t)got;
    if (cap - len < 4096) buf = realloc(buf, cap *= 2);
  }
  buf[len] = 0;
  close(fd);
  char *body = strstr(buf, "\r\n\r\n");
  if (strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 8, " 200", 4) || !body) {
    free(buf);
    return NULL;
  }
  memmove(buf, body + 4, strlen(body + 4) + 1);
  return buf;
}

/* s with every byte but [A-Za-z0-9_.-] as %XX, into out[cap]. */
static inline void url_encode(const char *s, char *out, size_t cap) {
  size_t n = 0;
  for (; *s && n + 4 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '.' || c == '-')
      out[n++] = (char)c;
    else
      n += (size_t)snprintf(out + n, cap - n, "%%%02X", c);
  }
  out[n] = 0;
}

/* A port free on 127.0.0.1 now (bound to 0 and released). */
static inline int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
      getsockname(fd, (struct sockaddr *)&sa, &sl))
    return -1;
  close(fd);
  return ntohs(sa.sin_port);
}

/* The port of the first "<what> on 127.0.0.1:PORT" in text; -1 if absent. */
static inline int port_after(const char *text, const char *what) {
  char pat[64];
  snprintf(pat, sizeof pat, "%s on 127.0.0.1:", what);
  const char *p = text ? strstr(text, pat) : NULL;
  return p ? atoi(p + strlen(pat)) : -1;
}

#endif
