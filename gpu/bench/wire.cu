// What bounds a bulk copy through Chidori on one machine: loopback TCP with 1, 2 and 4
// connections (receive buffers reused, or a fresh 8 MiB buffer per chunk as a naive reader
// allocates), and the GPU's side of 8 MiB chunks (pageable and pinned, each way).
//
//   nvcc -O2 -o wire wire.cu -lpthread && ./wire [MiB]
//
// One line per measurement: "name GB/s".
#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const size_t CHUNK = 8 << 20;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

struct job {
    int fd;
    size_t bytes;
    int fresh;  // receiver: a new buffer per chunk
};

/* Move `len` bytes of `buf` through `fd`, one direction (send or recv). */
static void move_all(int fd, char *buf, size_t len, int sending) {
    for (size_t off = 0; off < len;) {
        ssize_t n = sending ? send(fd, buf + off, len - off, 0) : recv(fd, buf + off, len - off, 0);
        if (n <= 0) { perror(sending ? "send" : "recv"); exit(1); }
        off += n;
    }
}

static void *sender(void *p) {
    struct job *j = (struct job *)p;
    char *buf = (char *)malloc(CHUNK);
    memset(buf, 7, CHUNK);
    for (size_t done = 0; done < j->bytes; done += CHUNK) {
        move_all(j->fd, buf, j->bytes - done < CHUNK ? j->bytes - done : CHUNK, 1);
    }
    free(buf);
    return NULL;
}

static void *receiver(void *p) {
    struct job *j = (struct job *)p;
    char *kept = (char *)malloc(CHUNK);
    memset(kept, 0, CHUNK);
    for (size_t done = 0; done < j->bytes; done += CHUNK) {
        char *buf = j->fresh ? (char *)malloc(CHUNK) : kept;
        move_all(j->fd, buf, j->bytes - done < CHUNK ? j->bytes - done : CHUNK, 0);
        if (j->fresh) free(buf);
    }
    free(kept);
    return NULL;
}

static double tcp(int streams, size_t total, int fresh) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 16) || getsockname(lfd, (struct sockaddr *)&a, &len)) {
        perror("listen");
        exit(1);
    }
    int cfd[8], sfd[8];
    for (int i = 0; i < streams; i++) {
        cfd[i] = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(cfd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(cfd[i], (struct sockaddr *)&a, sizeof a)) { perror("connect"); exit(1); }
        sfd[i] = accept(lfd, NULL, NULL);
    }
    pthread_t t[16];
    struct job jobs[16];
    double t0 = now();
    for (int i = 0; i < streams; i++) {
        jobs[2 * i] = (struct job){cfd[i], total / streams, 0};
        jobs[2 * i + 1] = (struct job){sfd[i], total / streams, fresh};
        pthread_create(&t[2 * i], NULL, sender, &jobs[2 * i]);
        pthread_create(&t[2 * i + 1], NULL, receiver, &jobs[2 * i + 1]);
    }
    for (int i = 0; i < 2 * streams; i++) pthread_join(t[i], NULL);
    double secs = now() - t0;
    for (int i = 0; i < streams; i++) {
        close(cfd[i]);
        close(sfd[i]);
    }
    close(lfd);
    return total / secs / 1e9;
}

static double gpu(size_t total, int pinned, int h2d) {
    char *host;
    if (pinned) {
        cudaMallocHost((void **)&host, CHUNK);
    } else {
        host = (char *)malloc(CHUNK);
    }
    memset(host, 1, CHUNK);
    char *dev;
    cudaMalloc((void **)&dev, total);
    cudaDeviceSynchronize();
    double t0 = now();
    for (size_t off = 0; off < total; off += CHUNK) {
        if (h2d) {
            cudaMemcpy(dev + off, host, CHUNK, cudaMemcpyHostToDevice);
        } else {
            cudaMemcpy(host, dev + off, CHUNK, cudaMemcpyDeviceToHost);
        }
    }
    double secs = now() - t0;
    cudaFree(dev);
    if (pinned) cudaFreeHost(host); else free(host);
    return total / secs / 1e9;
}

int main(int argc, char **argv) {
    size_t total = (size_t)(argc > 1 ? atoi(argv[1]) : 1024) << 20;
    int counts[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        printf("tcp %d stream(s), buffers reused %.2f GB/s\n", counts[i], tcp(counts[i], total, 0));
    }
    printf("tcp 1 stream, a fresh buffer per chunk %.2f GB/s\n", tcp(1, total, 1));
    printf("gpu 8 MiB chunks H2D pageable %.2f GB/s\n", gpu(total, 0, 1));
    printf("gpu 8 MiB chunks H2D pinned %.2f GB/s\n", gpu(total, 1, 1));
    printf("gpu 8 MiB chunks D2H pageable %.2f GB/s\n", gpu(total, 0, 0));
    printf("gpu 8 MiB chunks D2H pinned %.2f GB/s\n", gpu(total, 1, 0));
    return 0;
}
