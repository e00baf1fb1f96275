/* nccl-tune's test harness for NCCL tuner plugins: loads a plugin .so and calls it the way
 * NCCL core does (NCCL 2.30.7 src/enqueue.cc ncclGetAlgoInfo and src/plugin/tuner.cc):
 *   - looks up ncclTunerPlugin_v6 (NCCL_TUNER_PLUGIN_SYMBOL of the plugin's tuner.h);
 *   - init(&ctx, commId, nRanks, nNodes, logger, &nvlDomainInfo, &constants) once per
 *     communicator;
 *   - per collective: a flat float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS], every entry
 *     NCCL_ALGO_PROTO_IGNORE, then a cost >= 0 for each enabled (algo, proto) (NCCL core's
 *     updateCollCostTable; the numbers here are arbitrary positive costs), passed as float**;
 *     nChannels starts at 0 (nMaxChannels); getCollInfo(ctx, func, nBytes, numPipeOps=1,
 *     (float**)table, 7, 3, regBuff=0, &nChannels);
 *   - then, like topoGetAlgoInfo, the cheapest entry >= 0 is the algorithm/protocol, and a
 *     non-zero nChannels from the plugin replaces NCCL's own channel count.
 * Usage: harness PLUGIN.so NRANKS NNODES [F:A:P ...]   (F:A:P disables algorithm A, protocol
 * P for function F, -1 = all, as NCCL_ALGO / NCCL_PROTO or the topology would)
 * stdin: "FUNC NBYTES" per line (FUNC = ncclFunc_t number). stdout per line:
 * "FUNC NBYTES ALGO PROTO NCHANNELS ZEROED" where NCHANNELS 0 means NCCL's own and ZEROED is
 * "a/p" of the entry the plugin set to 0.0 (or "-"). Plugin INFO logs go to stderr. */
#include <dlfcn.h>
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tuner.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (level > NCCL_LOG_INFO) return; /* NCCL_DEBUG=INFO: no TRACE */
  va_list ap;
  va_start(ap, fmt);
  fputs("NCCL INFO ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

#define MAX_DISABLED 256

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PLUGIN.so NRANKS NNODES [F:A:P ...]\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  const ncclTuner_t* tuner = (const ncclTuner_t*)dlsym(lib, NCCL_TUNER_PLUGIN_SYMBOL);
  if (!tuner) { fprintf(stderr, "dlsym %s: %s\n", NCCL_TUNER_PLUGIN_SYMBOL, dlerror()); return 3; }
  size_t nRanks = strtoull(argv[2], NULL, 10), nNodes = strtoull(argv[3], NULL, 10);
  int disabled[MAX_DISABLED][3], nDisabled = 0;
  for (int i = 4; i < argc && nDisabled < MAX_DISABLED; i++) {
    if (sscanf(argv[i], "%d:%d:%d", &disabled[nDisabled][0], &disabled[nDisabled][1],
               &disabled[nDisabled][2]) == 3) nDisabled++;
  }
  ncclNvlDomainInfo_t nvl = {1, (int)nRanks, (int)nRanks};
  ncclTunerConstants_t constants;
  memset(&constants, 0, sizeof(constants));
  void* ctx = NULL;
  if (tuner->init(&ctx, 0x6e63636cULL, nRanks, nNodes, logger, &nvl, &constants) != ncclSuccess) {
    fprintf(stderr, "init failed\n");
    return 4;
  }
  int func;
  unsigned long long nBytes;
  while (scanf("%d %llu", &func, &nBytes) == 2) {
    float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++) {
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) {
        int off = 0;
        for (int d = 0; d < nDisabled; d++) {
          if ((disabled[d][0] == -1 || disabled[d][0] == func) &&
              (disabled[d][1] == -1 || disabled[d][1] == a) &&
              (disabled[d][2] == -1 || disabled[d][2] == p)) off = 1;
        }
        table[a][p] = off ? NCCL_ALGO_PROTO_IGNORE : 100.0f + 10.0f * a + p;
      }
    }
    float before[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    memcpy(before, table, sizeof(table));
    int nChannels = 0;
    ncclResult_t rc = tuner->getCollInfo(ctx, (ncclFunc_t)func, (size_t)nBytes, 1, (float**)table,
                                         NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &nChannels);
    if (rc != ncclSuccess) { printf("%d %llu ERROR %d\n", func, nBytes, (int)rc); fflush(stdout); continue; }
    float minTime = FLT_MAX;
    int algo = -1, proto = -1;
    char zeroed[16] = "-";
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++) {
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) {
        if (table[a][p] != before[a][p]) snprintf(zeroed, sizeof(zeroed), "%d/%d", a, p);
        if (table[a][p] == NCCL_ALGO_PROTO_IGNORE) continue;
        if (table[a][p] >= 0.0 && table[a][p] < minTime) { algo = a; proto = p; minTime = table[a][p]; }
      }
    }
    printf("%d %llu %d %d %d %s\n", func, nBytes, algo, proto, nChannels, zeroed);
    fflush(stdout);
  }
  tuner->finalize(ctx);
  dlclose(lib);
  return 0;
}
