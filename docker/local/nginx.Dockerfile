# A stand-in for the official nginx image, from Debian's nginx-light
# package where no registry can be reached (docker/cluster_smoke.sh). As
# the official image: the configuration is /etc/nginx/nginx.conf (compose
# mounts docker/nginx.cluster.conf there), nginx runs in the foreground,
# and its logs go to the container's stdout/stderr.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 8080
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
