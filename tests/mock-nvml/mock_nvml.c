/*
 * A mock libnvidia-ml.so.1 for tests on machines without a GPU: the NVML
 * calls the plugin's discovery makes, answered from a device table the test
 * writes (path in MOCK_NVML_TABLE), so the real nvml-wrapper code paths run.
 *
 * Table lines, fields separated by '|':
 *   driver|<version>                      nvmlSystemGetDriverVersion
 *   cuda|<version as int, 13000 = 13.0>   nvmlSystemGetCudaDriverVersion_v2
 *   gpu|<minor>|<uuid>|<name>|<brand>|<arch>|<cc major>|<cc minor>|<memory bytes>|<bus id>|<pci device id>|<numa>
 *   link|<minor>|<link>|<remote bus id>   an active NVLink to a GPU
 *   fabric|<minor>|<cluster uuid, 32 hex digits>|<clique id>|<v2 only: 0/1>
 *                                         NVLink fabric registration; with
 *                                         v2 only, a v3 query gets
 *                                         NVML_ERROR_ARGUMENT_VERSION_MISMATCH
 *   migmode|<minor>                       MIG mode is on
 *   profile|<minor>|<index>|<id>|<slices>|<instances>|<SMs>|<CEs>|<decoders>|<encoders>|<jpeg>|<ofa>|<memory MiB>|<name>
 *   mig|<parent minor>|<uuid>|<gpu instance id>|<compute instance id>|<profile id>|<start>|<size>
 *   placement|<minor>|<profile id>|<start>|<size>
 *                                         a possible placement of a profile
 *                                         (nvmlDeviceGetGpuInstancePossiblePlacements_v2)
 *
 * Each `mig` line is a GPU instance with one compute instance spanning it;
 * instances are created and destroyed through NVML too (the lifecycle block
 * at the end), with their state in MOCK_NVML_STATE.
 *
 * XID events: lines `<minor>|<xid>` appended to `<table>.events` are
 * delivered, in order, by nvmlEventSetWait_v2.
 *
 * Load figures (utilization, power, ...): see the telemetry block at the
 * end (MOCK_NVML_TELEMETRY).
 *
 * Structs and enum values follow nvml.h as nvml-wrapper-sys 0.10 binds it.
 * Anything not implemented is simply absent: nvml-wrapper reports a missing
 * symbol, which discovery treats as "not supported".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL

#define MAX_GPUS 64
#define MAX_LINKS 18

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int index, id, slices, instances, sms, ces, decoders, encoders, jpeg, ofa;
    unsigned long long memory_mib;
    char name[96];
} mock_profile;

#define MAX_PROFILES 16
#define MAX_MIGS 8

typedef struct mock_gpu {
    unsigned int minor;
    int mig_mode;
    mock_profile profiles[MAX_PROFILES];
    unsigned int profile_count;
    struct mock_gpu *migs[MAX_MIGS];
    unsigned int mig_count;
    int has_fabric, fabric_v2_only;
    unsigned char cluster[16];
    unsigned int clique;
    /* For a MIG device: its parent and instance. A GPU instance without a
     * compute instance (has_ci 0) is no MIG device yet (see the lifecycle
     * block at the end). */
    struct mock_gpu *parent;
    unsigned int gi_id, ci_id, profile_id, start, size;
    int has_ci;
    unsigned int ci_profile_id;
    /* MIG mode awaiting a GPU reset (Ampere): see nvmlDeviceSetMigMode. */
    int mig_pending;
    char uuid[96];
    char name[96];
    int brand;
    unsigned int arch;
    int cc_major, cc_minor;
    unsigned long long memory;
    char bus_id[32];
    unsigned int pci_device_id;
    unsigned int numa;
    char links[MAX_LINKS][32];
} mock_gpu;

typedef mock_gpu *nvmlDevice_t;

static mock_gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static mock_gpu mig_devices[MAX_GPUS * MAX_MIGS];
static unsigned int mig_device_count;
static char driver_version[80];
static int cuda_version;
static int initialized;

/* In the lifecycle block at the end. */
#define NO_CI_PROFILE 0xFFFFFFFFu
static void lifecycle_restore(void);

static mock_gpu *by_minor(unsigned int minor) {
    for (unsigned int i = 0; i < gpu_count; i++)
        if (gpus[i].minor == minor) return &gpus[i];
    return NULL;
}

/* ==== dynmig: MIG profile placements (queries only) ====
 * One table of every placement NVML offers per (GPU, profile id), and
 * nvmlDeviceGetGpuInstancePossiblePlacements_v2 answering from it. Instance
 * creation and destruction are elsewhere. */
#define MAX_PLACEMENTS (MAX_GPUS * 32)

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int minor, profile_id;
    nvmlGpuInstancePlacement_t placement;
} mock_placement;

static mock_placement placements[MAX_PLACEMENTS];
static unsigned int placement_count;

/* placement|<minor>|<profile id>|<start>|<size> */
static void load_placement(char **fields) {
    if (placement_count >= MAX_PLACEMENTS) return;
    mock_placement *p = &placements[placement_count++];
    p->minor = (unsigned int)strtoul(fields[1], NULL, 10);
    p->profile_id = (unsigned int)strtoul(fields[2], NULL, 10);
    p->placement.start = (unsigned int)strtoul(fields[3], NULL, 10);
    p->placement.size = (unsigned int)strtoul(fields[4], NULL, 10);
}

/* As NVML: a NULL array asks for the count; too small an array is
 * NVML_ERROR_INSUFFICIENT_SIZE with the count needed; a profile the GPU
 * lacks is NVML_ERROR_NOT_SUPPORTED; a MIG device handle is refused. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *out, unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent || !d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    int known = 0;
    for (unsigned int i = 0; i < d->profile_count; i++)
        if (d->profiles[i].id == profileId) known = 1;
    if (!known) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0;
    for (unsigned int i = 0; i < placement_count; i++)
        if (placements[i].minor == d->minor && placements[i].profile_id == profileId) n++;
    if (!out) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (unsigned int i = 0; i < placement_count; i++)
        if (placements[i].minor == d->minor && placements[i].profile_id == profileId) out[k++] = placements[i].placement;
    *count = n;
    return NVML_SUCCESS;
}
/* ==== end dynmig ==== */

/* Splits a line of one of the mock's files (table, state, telemetry) at
 * '|' into at most max fields, the newline dropped; returns how many. */
static int split_fields(char *line, char **fields, int max) {
    line[strcspn(line, "\n")] = 0;
    int n = 0;
    for (char *p = strtok(line, "|"); p && n < max; p = strtok(NULL, "|")) fields[n++] = p;
    return n;
}

/* Opens <base><suffix> (a file beside the table or the state file) for
 * reading; NULL when there is no base or no such file. */
static FILE *open_beside(const char *base, const char *suffix) {
    if (!base) return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s%s", base, suffix);
    return fopen(path, "r");
}

static int load_table(void) {
    const char *path = getenv("MOCK_NVML_TABLE");
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    /* nvmlInit may run again in the same process (another Nvml session):
     * start from the table each time, not on top of it. */
    gpu_count = 0;
    mig_device_count = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *fields[16];
        int n = split_fields(line, fields, 16);
        if (n == 2 && !strcmp(fields[0], "driver")) {
            snprintf(driver_version, sizeof driver_version, "%s", fields[1]);
        } else if (n == 2 && !strcmp(fields[0], "cuda")) {
            cuda_version = atoi(fields[1]);
        } else if (n == 12 && !strcmp(fields[0], "gpu") && gpu_count < MAX_GPUS) {
            mock_gpu *g = &gpus[gpu_count++];
            memset(g, 0, sizeof *g);
            g->minor = (unsigned int)strtoul(fields[1], NULL, 10);
            snprintf(g->uuid, sizeof g->uuid, "%s", fields[2]);
            snprintf(g->name, sizeof g->name, "%s", fields[3]);
            g->brand = atoi(fields[4]);
            g->arch = (unsigned int)strtoul(fields[5], NULL, 10);
            g->cc_major = atoi(fields[6]);
            g->cc_minor = atoi(fields[7]);
            g->memory = strtoull(fields[8], NULL, 10);
            snprintf(g->bus_id, sizeof g->bus_id, "%s", fields[9]);
            g->pci_device_id = (unsigned int)strtoul(fields[10], NULL, 0);
            g->numa = (unsigned int)strtoul(fields[11], NULL, 10);
        } else if (n == 5 && !strcmp(fields[0], "fabric")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            if (g && strlen(fields[2]) == 32) {
                for (int i = 0; i < 16; i++) {
                    unsigned int byte = 0;
                    sscanf(fields[2] + 2 * i, "%2x", &byte);
                    g->cluster[i] = (unsigned char)byte;
                }
                g->has_fabric = 1;
                g->clique = (unsigned int)strtoul(fields[3], NULL, 10);
                g->fabric_v2_only = atoi(fields[4]);
            }
        } else if (n == 2 && !strcmp(fields[0], "migmode")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            if (g) g->mig_mode = g->mig_pending = 1;
        } else if (n == 14 && !strcmp(fields[0], "profile")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            if (g && g->profile_count < MAX_PROFILES) {
                mock_profile *p = &g->profiles[g->profile_count++];
                unsigned int *u[] = {&p->index, &p->id, &p->slices, &p->instances, &p->sms, &p->ces,
                                     &p->decoders, &p->encoders, &p->jpeg, &p->ofa};
                for (int i = 0; i < 10; i++) *u[i] = (unsigned int)strtoul(fields[2 + i], NULL, 10);
                p->memory_mib = strtoull(fields[12], NULL, 10);
                snprintf(p->name, sizeof p->name, "%s", fields[13]);
            }
        } else if (n == 8 && !strcmp(fields[0], "mig") && mig_device_count < MAX_GPUS * MAX_MIGS) {
            mock_gpu *parent = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            if (parent && parent->mig_count < MAX_MIGS) {
                mock_gpu *m = &mig_devices[mig_device_count++];
                memset(m, 0, sizeof *m);
                m->parent = parent;
                m->minor = parent->minor;
                snprintf(m->uuid, sizeof m->uuid, "%s", fields[2]);
                m->gi_id = (unsigned int)strtoul(fields[3], NULL, 10);
                m->ci_id = (unsigned int)strtoul(fields[4], NULL, 10);
                m->profile_id = (unsigned int)strtoul(fields[5], NULL, 10);
                m->start = (unsigned int)strtoul(fields[6], NULL, 10);
                m->size = (unsigned int)strtoul(fields[7], NULL, 10);
                m->has_ci = 1;
                m->ci_profile_id = NO_CI_PROFILE;
                parent->migs[parent->mig_count++] = m;
            }
        } else if (n == 5 && !strcmp(fields[0], "placement")) {
            load_placement(fields);
        } else if (n == 4 && !strcmp(fields[0], "link")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            unsigned int link = (unsigned int)strtoul(fields[2], NULL, 10);
            if (g && link < MAX_LINKS) snprintf(g->links[link], sizeof g->links[link], "%s", fields[3]);
        }
    }
    fclose(f);
    lifecycle_restore();
    return 1;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

/* Sessions are counted as NVIDIA's library counts them: every nvmlInit
 * is paired with an nvmlShutdown, and NVML stays usable until the last
 * one. The table (and the instance state) is read when the first session
 * opens, never under another session's feet. */
static pthread_mutex_t session_lock = PTHREAD_MUTEX_INITIALIZER;

nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&session_lock);
    nvmlReturn_t result = NVML_SUCCESS;
    if (initialized == 0 && !load_table()) result = NVML_ERROR_UNKNOWN;
    else initialized++;
    pthread_mutex_unlock(&session_lock);
    return result;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&session_lock);
    nvmlReturn_t result = initialized == 0 ? NVML_ERROR_UNINITIALIZED : NVML_SUCCESS;
    if (initialized > 0) initialized--;
    pthread_mutex_unlock(&session_lock);
    return result;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_string(driver_version, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    return copy_string(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    return copy_string(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    *minor = d->minor;
    return NVML_SUCCESS;
}

static void fill_pci(const char *bus_id, unsigned int device_id, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0, function = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &function);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff, bus, dev, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device_id;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    fill_pci(d->bus_id, d->pci_device_id, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) {
    *brand = d->brand;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) {
    *arch = d->arch;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

static unsigned long long telemetry_memory_used(const mock_gpu *d); /* telemetry block */

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    memory->total = d->memory;
    memory->reserved = 0;
    memory->used = telemetry_memory_used(d);
    memory->free = d->memory > memory->used ? d->memory - memory->used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (d->parent) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)d->mig_mode;
    *pending = (unsigned int)d->mig_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    *count = d->mig_count;
    return NVML_SUCCESS;
}

/* MIG devices are the GPU instances that have a compute instance. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    for (unsigned int i = 0, seen = 0; i < d->mig_count; i++) {
        if (!d->migs[i]->has_ci) continue;
        if (seen++ == index) {
            *mig = d->migs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (!d->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi_id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (!d->parent) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci_id;
    return NVML_SUCCESS;
}

/* A GPU-instance handle is the MIG device with that instance. */
nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlDevice_t *gi) {
    for (unsigned int i = 0; i < d->mig_count; i++)
        if (d->migs[i]->gi_id == id) {
            *gi = d->migs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    unsigned int start;
    unsigned int size;
} nvmlGpuInstanceInfo_t;

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlDevice_t gi, nvmlGpuInstanceInfo_t *info) {
    info->device = gi->parent;
    info->id = gi->gi_id;
    info->profileId = gi->profile_id;
    info->start = gi->start;
    info->size = gi->size;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, copyEngineCount, decoderCount,
        encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int index,
                                                  nvmlGpuInstanceProfileInfo_v3_t *info) {
    if ((info->version >> 24) != 3) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int i = 0; i < d->profile_count; i++) {
        mock_profile *p = &d->profiles[i];
        if (p->index != index) continue;
        info->id = p->id;
        info->sliceCount = p->slices;
        info->instanceCount = p->instances;
        info->multiprocessorCount = p->sms;
        info->copyEngineCount = p->ces;
        info->decoderCount = p->decoders;
        info->encoderCount = p->encoders;
        info->jpegCount = p->jpeg;
        info->ofaCount = p->ofa;
        info->memorySizeMB = p->memory_mib;
        snprintf(info->name, sizeof info->name, "MIG %s", p->name);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) {
    *node = d->numa;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *active = d->links[link][0] != 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    if (link >= MAX_LINKS || !d->links[link][0]) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(d->links[link], 0, pci);
    return NVML_SUCCESS;
}

/* NVML_NVLINK_DEVICE_TYPE_GPU */
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, int *type) {
    if (link >= MAX_LINKS || !d->links[link][0]) return NVML_ERROR_INVALID_ARGUMENT;
    *type = 0;
    return NVML_SUCCESS;
}

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

static int event_set;
static long events_consumed;

nvmlReturn_t nvmlEventSetCreate(void **set) {
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    (void)set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, void *set) {
    (void)d;
    (void)types;
    (void)set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    (void)d;
    *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return NVML_SUCCESS;
}

/* The next unread line of <table>.events, if any. */
static int next_event(unsigned int *minor, unsigned long long *xid) {
    FILE *f = open_beside(getenv("MOCK_NVML_TABLE"), ".events");
    if (!f) return 0;
    char line[256];
    long index = 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n')) break; /* a line still being written */
        if (index++ < events_consumed) continue;
        if (sscanf(line, "%u|%llu", minor, xid) == 2) {
            found = 1;
            events_consumed = index;
            break;
        }
        events_consumed = index;
    }
    fclose(f);
    return found;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)set;
    unsigned int waited = 0;
    for (;;) {
        unsigned int minor;
        unsigned long long xid;
        if (next_event(&minor, &xid)) {
            mock_gpu *g = by_minor(minor);
            if (!g) continue;
            memset(data, 0, sizeof *data);
            data->device = g;
            data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
            data->eventData = xid;
            data->gpuInstanceId = 0xFFFFFFFF;
            data->computeInstanceId = 0xFFFFFFFF;
            return NVML_SUCCESS;
        }
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
        waited += 50;
    }
}

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

/* NVML_GPU_FABRIC_STATE_COMPLETED */
#define FABRIC_COMPLETED 3

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfo_v3_t *info) {
    if (!d->has_fabric) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int version = info->version >> 24;
    if ((version == 3 && d->fabric_v2_only) || (version != 2 && version != 3))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memcpy(info->clusterUuid, d->cluster, 16);
    info->status = NVML_SUCCESS;
    info->cliqueId = d->clique;
    info->state = FABRIC_COMPLETED;
    info->healthMask = 0;
    if (version == 3) info->healthSummary = 0;
    return NVML_SUCCESS;
}

/* ======================================================================
 * Instance lifecycle (migprep): creating and destroying GPU and compute
 * instances, MIG mode get/set, and the instance table's persistence.
 *
 * State: with MOCK_NVML_STATE set, the GPU instances, compute instances
 * and MIG modes live in that file, rewritten (temporary file + rename)
 * after every change and read at nvmlInit, so a process killed by SIGKILL
 * and started again sees the instances that exist, as on a real GPU. When
 * the file does not exist yet, the table's `mig|` and `migmode|` lines are
 * the starting point. Lines:
 *   mode|<minor>|<current>|<pending>
 *   gi|<minor>|<gi id>|<profile id>|<start>|<size>|<has ci>|<ci id>|<ci profile id>|<uuid or ->
 *   generation|<n>                       (makes every new MIG UUID unique)
 *
 * Capabilities: with MOCK_NVML_PROC_ROOT set, each GPU instance has
 * <root>/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and each
 * compute instance .../gi<G>/ci<C>/access ("DeviceFileMinor: <N>"), with
 * the minors of the driver's /proc/driver/nvidia-caps/mig-minors table
 * (gi: 3 + 135 * minor + 9 * G; ci: that + 1 + C); they appear and go with
 * the instances.
 *
 * Failures, as NVML reports them:
 *   - a placement overlapping an instance, beyond the GPU's 8 memory
 *     slices, or a profile already at its instance count:
 *     NVML_ERROR_INSUFFICIENT_RESOURCES;
 *   - an unknown profile, MIG mode off: NVML_ERROR_INVALID_ARGUMENT /
 *     NVML_ERROR_NOT_SUPPORTED;
 *   - destroying a GPU instance that still has a compute instance, or
 *     one with processes: NVML_ERROR_IN_USE. Processes are lines in
 *     <MOCK_NVML_STATE>.busy: `<minor>` (on the whole GPU) or
 *     `<minor>|<gi id>` (in that GPU instance);
 *   - MIG mode: on Hopper and later (architecture >= 9) it changes at
 *     once when the GPU has no processes and no instances, else
 *     NVML_ERROR_IN_USE; on Ampere the request is pending (current mode
 *     unchanged, activation status NVML_ERROR_RESET_REQUIRED) until a
 *     reset, which a test makes by editing the state file.
 * ====================================================================== */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_RESET_REQUIRED 16
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define NVML_ARCH_HOPPER 9
#define MEMORY_SLICES 8
#define MAX_GI_ID 15

static unsigned long long uuid_generation;

/* nvmlGpuInstancePlacement_t: in the placements block (dynmig) above. */

typedef struct {
    nvmlDevice_t device;
    nvmlDevice_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    unsigned int placementStart;
    unsigned int placementSize;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

/* NVML_COMPUTE_INSTANCE_PROFILE_*: index -> compute slices (ids equal indices). */
static const unsigned int ci_profile_slices[] = {1, 2, 3, 4, 7, 8, 6};
#define CI_PROFILE_COUNT (sizeof ci_profile_slices / sizeof ci_profile_slices[0])

static mock_profile *profile_by_id(mock_gpu *g, unsigned int id) {
    for (unsigned int i = 0; i < g->profile_count; i++)
        if (g->profiles[i].id == id) return &g->profiles[i];
    return NULL;
}

/* The compute-instance profile spanning a GPU instance of `slices`. */
static unsigned int full_ci_profile(unsigned int slices) {
    for (unsigned int i = 0; i < CI_PROFILE_COUNT; i++)
        if (ci_profile_slices[i] == slices) return i;
    return 0;
}

static unsigned int ci_profile_of(mock_gpu *m) {
    if (m->ci_profile_id != NO_CI_PROFILE) return m->ci_profile_id;
    mock_profile *p = profile_by_id(m->parent, m->profile_id);
    return full_ci_profile(p ? p->slices : 1);
}

static const char *env_path(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0755);
        *p = '/';
    }
    mkdir(buf, 0755);
}

static unsigned int gi_cap_minor(unsigned int minor, unsigned int gi) { return 3 + 135 * minor + 9 * gi; }

/* Writes a capability `access` file unless it exists (its minor never
   changes: it follows from the GPU minor and the instance ids). */
static void write_access(const char *path, unsigned int minor) {
    struct stat st;
    if (stat(path, &st) == 0) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
    fclose(f);
}

/* Removes <dir>/ci<ci> if it exists. */
static void remove_ci(const char *dir, unsigned int ci) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/ci%u", dir, ci);
    if (stat(path, &st) != 0) return;
    snprintf(path, sizeof path, "%s/ci%u/access", dir, ci);
    unlink(path);
    snprintf(path, sizeof path, "%s/ci%u", dir, ci);
    rmdir(path);
}

/* Makes <proc>/driver/nvidia/capabilities/gpu<minor>/mig match the GPU's
   instances, changing only the entries of instances that came or went, as
   the driver does (rewriting every possible path on each change cost a
   millisecond of a core per NVML call and churned the dentry cache). */
static void sync_caps(mock_gpu *g) {
    const char *root = env_path("MOCK_NVML_PROC_ROOT");
    if (!root) return;
    char dir[4096], path[4200];
    for (unsigned int gi = 0; gi <= MAX_GI_ID; gi++) {
        snprintf(dir, sizeof dir, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%u", root, g->minor, gi);
        mock_gpu *m = NULL;
        for (unsigned int i = 0; i < g->mig_count; i++)
            if (g->migs[i]->gi_id == gi) m = g->migs[i];
        struct stat st;
        int exists = stat(dir, &st) == 0;
        if (!m) {
            if (!exists) continue;
            for (unsigned int ci = 0; ci < 8; ci++) remove_ci(dir, ci);
            snprintf(path, sizeof path, "%s/access", dir);
            unlink(path);
            rmdir(dir);
            continue;
        }
        unsigned int gi_minor = gi_cap_minor(g->minor, gi);
        if (!exists) mkdirs(dir);
        snprintf(path, sizeof path, "%s/access", dir);
        write_access(path, gi_minor);
        for (unsigned int ci = 0; ci < 8; ci++) {
            if (m->has_ci && ci == m->ci_id) {
                snprintf(path, sizeof path, "%s/ci%u", dir, ci);
                mkdir(path, 0755);
                snprintf(path, sizeof path, "%s/ci%u/access", dir, ci);
                write_access(path, gi_minor + 1 + ci);
            } else if (exists) {
                remove_ci(dir, ci);
            }
        }
    }
}

/* Writes the state file atomically; 0 on failure (reported as UNKNOWN). */
static int save_state(void) {
    const char *path = env_path("MOCK_NVML_STATE");
    if (!path) return 1;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return 0;
    fprintf(f, "generation|%llu\n", uuid_generation);
    for (unsigned int i = 0; i < gpu_count; i++) {
        mock_gpu *g = &gpus[i];
        fprintf(f, "mode|%u|%d|%d\n", g->minor, g->mig_mode, g->mig_pending);
        for (unsigned int j = 0; j < g->mig_count; j++) {
            mock_gpu *m = g->migs[j];
            /* "-" for no UUID yet: strtok would skip an empty field. */
            fprintf(f, "gi|%u|%u|%u|%u|%u|%d|%u|%u|%s\n", g->minor, m->gi_id, m->profile_id, m->start, m->size,
                    m->has_ci, m->ci_id, ci_profile_of(m), m->uuid[0] ? m->uuid : "-");
        }
    }
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    return ok && rename(tmp, path) == 0;
}

static mock_gpu *new_mig_slot(mock_gpu *parent) {
    if (parent->mig_count >= MAX_MIGS) return NULL;
    mock_gpu *m = NULL;
    for (unsigned int i = 0; i < mig_device_count; i++)
        if (!mig_devices[i].parent) {
            m = &mig_devices[i];
            break;
        }
    if (!m) {
        if (mig_device_count >= MAX_GPUS * MAX_MIGS) return NULL;
        m = &mig_devices[mig_device_count++];
    }
    memset(m, 0, sizeof *m);
    m->parent = parent;
    m->minor = parent->minor;
    m->ci_profile_id = NO_CI_PROFILE;
    parent->migs[parent->mig_count++] = m;
    return m;
}

static void free_mig_slot(mock_gpu *m) {
    mock_gpu *parent = m->parent;
    for (unsigned int i = 0; i < parent->mig_count; i++)
        if (parent->migs[i] == m) {
            memmove(&parent->migs[i], &parent->migs[i + 1], (parent->mig_count - i - 1) * sizeof parent->migs[0]);
            parent->mig_count--;
            break;
        }
    memset(m, 0, sizeof *m);
}

/* Replaces the table's instances and modes with the state file's, if any. */
static void lifecycle_restore(void) {
    const char *path = env_path("MOCK_NVML_STATE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    for (unsigned int i = 0; i < gpu_count; i++) gpus[i].mig_count = 0;
    mig_device_count = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *fields[12];
        int n = split_fields(line, fields, 12);
        if (n == 2 && !strcmp(fields[0], "generation")) {
            uuid_generation = strtoull(fields[1], NULL, 10);
        } else if (n == 4 && !strcmp(fields[0], "mode")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            if (g) {
                g->mig_mode = atoi(fields[2]);
                g->mig_pending = atoi(fields[3]);
            }
        } else if (n == 10 && !strcmp(fields[0], "gi")) {
            mock_gpu *g = by_minor((unsigned int)strtoul(fields[1], NULL, 10));
            mock_gpu *m = g ? new_mig_slot(g) : NULL;
            if (!m) continue;
            m->gi_id = (unsigned int)strtoul(fields[2], NULL, 10);
            m->profile_id = (unsigned int)strtoul(fields[3], NULL, 10);
            m->start = (unsigned int)strtoul(fields[4], NULL, 10);
            m->size = (unsigned int)strtoul(fields[5], NULL, 10);
            m->has_ci = atoi(fields[6]);
            m->ci_id = (unsigned int)strtoul(fields[7], NULL, 10);
            m->ci_profile_id = (unsigned int)strtoul(fields[8], NULL, 10);
            snprintf(m->uuid, sizeof m->uuid, "%s", strcmp(fields[9], "-") ? fields[9] : "");
        }
    }
    fclose(f);
}

/* Whether <MOCK_NVML_STATE>.busy lists processes on GPU `minor` (gi NULL:
 * anywhere on it) or in its GPU instance `*gi`. */
static int busy(unsigned int minor, const unsigned int *gi) {
    FILE *f = open_beside(env_path("MOCK_NVML_STATE"), ".busy");
    if (!f) return 0;
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned int m, g;
        int n = sscanf(line, "%u|%u", &m, &g);
        if (n >= 1 && m == minor && (n == 1 || !gi || g == *gi)) found = 1;
    }
    fclose(f);
    return found;
}

static int is_gpu(nvmlDevice_t d) { return d && d >= &gpus[0] && d < &gpus[gpu_count]; }

static int is_instance(nvmlDevice_t d) {
    return d && d >= &mig_devices[0] && d < &mig_devices[mig_device_count] && d->parent;
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!is_gpu(d) || mode > 1 || !activation) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->profile_count) return NVML_ERROR_NOT_SUPPORTED;
    if (d->mig_count || busy(d->minor, NULL)) {
        *activation = NVML_ERROR_IN_USE;
        return NVML_ERROR_IN_USE;
    }
    d->mig_pending = (int)mode;
    if (d->arch >= NVML_ARCH_HOPPER) {
        d->mig_mode = (int)mode;
        *activation = NVML_SUCCESS;
    } else {
        *activation = d->mig_mode == (int)mode ? NVML_SUCCESS : NVML_ERROR_RESET_REQUIRED;
    }
    return save_state() ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profile_id,
                                                      const nvmlGpuInstancePlacement_t *placement, nvmlDevice_t *gi) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!is_gpu(d) || !placement || !gi) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    mock_profile *p = profile_by_id(d, profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (placement->size == 0 || placement->start + placement->size > MEMORY_SLICES)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned int same_profile = 0;
    for (unsigned int i = 0; i < d->mig_count; i++) {
        mock_gpu *o = d->migs[i];
        if (placement->start < o->start + o->size && o->start < placement->start + placement->size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
        if (o->profile_id == profile_id) same_profile++;
    }
    if (same_profile >= p->instances) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned int id = 1;
    for (; id <= MAX_GI_ID; id++) {
        int taken = 0;
        for (unsigned int i = 0; i < d->mig_count; i++) taken |= d->migs[i]->gi_id == id;
        if (!taken) break;
    }
    mock_gpu *m = id <= MAX_GI_ID ? new_mig_slot(d) : NULL;
    if (!m) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    m->gi_id = id;
    m->profile_id = profile_id;
    m->start = placement->start;
    m->size = placement->size;
    if (!save_state()) {
        free_mig_slot(m);
        return NVML_ERROR_UNKNOWN;
    }
    sync_caps(d);
    *gi = m;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlDevice_t gi) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!is_instance(gi)) return NVML_ERROR_INVALID_ARGUMENT;
    mock_gpu *parent = gi->parent;
    if (gi->has_ci || busy(parent->minor, &gi->gi_id)) return NVML_ERROR_IN_USE;
    free_mig_slot(gi);
    if (!save_state()) return NVML_ERROR_UNKNOWN;
    sync_caps(parent);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlDevice_t gi, unsigned int profile,
                                                           unsigned int eng_profile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    (void)eng_profile;
    if (!is_instance(gi) || !info) return NVML_ERROR_INVALID_ARGUMENT;
    if ((info->version >> 24) != 2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    mock_profile *p = profile_by_id(gi->parent, gi->profile_id);
    if (profile >= CI_PROFILE_COUNT || !p || ci_profile_slices[profile] > p->slices) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int slices = ci_profile_slices[profile];
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = p->slices / slices;
    info->multiprocessorCount = p->sms * slices / (p->slices ? p->slices : 1);
    info->sharedCopyEngineCount = p->ces;
    info->sharedDecoderCount = p->decoders;
    info->sharedEncoderCount = p->encoders;
    info->sharedJpegCount = p->jpeg;
    info->sharedOfaCount = p->ofa;
    snprintf(info->name, sizeof info->name, "MIG %uc.%.80s", slices, p->name);
    return NVML_SUCCESS;
}

/* Only the compute instance spanning its GPU instance, as the plugin makes. */
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlDevice_t gi, unsigned int profile_id, nvmlDevice_t *ci) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!is_instance(gi) || !ci) return NVML_ERROR_INVALID_ARGUMENT;
    mock_profile *p = profile_by_id(gi->parent, gi->profile_id);
    if (profile_id >= CI_PROFILE_COUNT || !p || ci_profile_slices[profile_id] > p->slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gi->has_ci || ci_profile_slices[profile_id] != p->slices) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    gi->has_ci = 1;
    gi->ci_id = 0;
    gi->ci_profile_id = profile_id;
    uuid_generation++;
    snprintf(gi->uuid, sizeof gi->uuid, "MIG-%08x-%04x-4%03x-8%03x-%012llx", 0x6d160000u | gi->parent->minor,
             gi->gi_id, gi->start, gi->size, uuid_generation);
    if (!save_state()) {
        gi->has_ci = 0;
        return NVML_ERROR_UNKNOWN;
    }
    sync_caps(gi->parent);
    *ci = gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlDevice_t ci) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!is_instance(ci) || !ci->has_ci) return NVML_ERROR_INVALID_ARGUMENT;
    if (busy(ci->parent->minor, &ci->gi_id)) return NVML_ERROR_IN_USE;
    ci->has_ci = 0;
    if (!save_state()) {
        ci->has_ci = 1;
        return NVML_ERROR_UNKNOWN;
    }
    sync_caps(ci->parent);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlDevice_t gi, unsigned int id, nvmlDevice_t *ci) {
    if (!is_instance(gi) || !ci) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gi->has_ci || gi->ci_id != id) return NVML_ERROR_NOT_FOUND;
    *ci = gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlDevice_t ci, nvmlComputeInstanceInfo_t *info) {
    if (!is_instance(ci) || !ci->has_ci || !info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = ci->parent;
    info->gpuInstance = ci;
    info->id = ci->ci_id;
    info->profileId = ci_profile_of(ci);
    info->placementStart = 0;
    info->placementSize = ci_profile_slices[info->profileId < CI_PROFILE_COUNT ? info->profileId : 0];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count; i++)
        if (!strcmp(gpus[i].uuid, uuid)) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    for (unsigned int i = 0; i < mig_device_count; i++)
        if (mig_devices[i].parent && mig_devices[i].has_ci && !strcmp(mig_devices[i].uuid, uuid)) {
            *device = &mig_devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
/* ====================== end of the lifecycle block ====================== */

/* ===================== telemetry block (load figures) =====================
 * The numbers the plugin's telemetry samples, from a file a test writes
 * and may rewrite at any time (path in MOCK_NVML_TELEMETRY; re-read when
 * its modification time or size changes). One line per device, by UUID
 * (a GPU's or a MIG device's), fields separated by '|':
 *   load|<uuid>|<gpu util %>|<memory util %>|<memory used bytes>|<power mW>|<temperature C>|<SM clock MHz>|<ECC corrected>|<ECC uncorrected>
 * A field `-` makes that call answer NVML_ERROR_NOT_SUPPORTED, as real
 * NVML does for a MIG device's utilization; a device without a line
 * answers NOT_SUPPORTED to all of them (memory used: 0).
 */
#include <sys/stat.h>

#define TELEMETRY_FIELDS 8
#define MAX_LOADS (MAX_GPUS * (MAX_MIGS + 1))

typedef struct {
    char uuid[96];
    int has[TELEMETRY_FIELDS];
    unsigned long long value[TELEMETRY_FIELDS];
} mock_load;

enum { L_GPU_UTIL, L_MEM_UTIL, L_MEM_USED, L_POWER, L_TEMP, L_SM_CLOCK, L_ECC_CORRECTED, L_ECC_UNCORRECTED };

static mock_load loads[MAX_LOADS];
static unsigned int load_count;
static struct timespec loads_mtime;
static off_t loads_size = -1;

static void read_loads(void) {
    const char *path = getenv("MOCK_NVML_TELEMETRY");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        load_count = 0;
        loads_size = -1;
        return;
    }
    if (st.st_size == loads_size && st.st_mtim.tv_sec == loads_mtime.tv_sec &&
        st.st_mtim.tv_nsec == loads_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    loads_mtime = st.st_mtim;
    loads_size = st.st_size;
    load_count = 0;
    char line[1024];
    while (fgets(line, sizeof line, f) && load_count < MAX_LOADS) {
        char *fields[2 + TELEMETRY_FIELDS];
        int n = split_fields(line, fields, 2 + TELEMETRY_FIELDS);
        if (n != 2 + TELEMETRY_FIELDS || strcmp(fields[0], "load")) continue;
        mock_load *l = &loads[load_count++];
        snprintf(l->uuid, sizeof l->uuid, "%s", fields[1]);
        for (int i = 0; i < TELEMETRY_FIELDS; i++) {
            l->has[i] = strcmp(fields[2 + i], "-") != 0;
            l->value[i] = l->has[i] ? strtoull(fields[2 + i], NULL, 10) : 0;
        }
    }
    fclose(f);
}

/* The field of device `d`, or 0 when it has none. */
static int load_field(const mock_gpu *d, int field, unsigned long long *value) {
    read_loads();
    for (unsigned int i = 0; i < load_count; i++) {
        if (!strcmp(loads[i].uuid, d->uuid) && loads[i].has[field]) {
            *value = loads[i].value[field];
            return 1;
        }
    }
    return 0;
}

static unsigned long long telemetry_memory_used(const mock_gpu *d) {
    unsigned long long used = 0;
    return load_field(d, L_MEM_USED, &used) ? used : 0;
}

/* nvmlDeviceGetHandleByUUID: the lifecycle block's (GPUs and MIG devices). */

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *utilization) {
    unsigned long long gpu, memory;
    if (!load_field(d, L_GPU_UTIL, &gpu) || !load_field(d, L_MEM_UTIL, &memory)) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned int)gpu;
    utilization->memory = (unsigned int)memory;
    return NVML_SUCCESS;
}

static nvmlReturn_t answer_uint(const mock_gpu *d, int field, unsigned int *out) {
    unsigned long long value;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!load_field(d, field, &value)) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *milliwatts) {
    return answer_uint(d, L_POWER, milliwatts);
}

#define NVML_TEMPERATURE_GPU 0
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *celsius) {
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return answer_uint(d, L_TEMP, celsius);
}

#define NVML_CLOCK_SM 1
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    if (type != NVML_CLOCK_SM) return NVML_ERROR_NOT_SUPPORTED;
    return answer_uint(d, L_SM_CLOCK, mhz);
}

#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type,
                                         unsigned long long *count) {
    (void)counter_type;
    int field = error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED     ? L_ECC_CORRECTED
                : error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? L_ECC_UNCORRECTED
                                                                    : -1;
    if (field < 0 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    return load_field(d, field, count) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}
/* =================== end of telemetry block (load figures) =================== */
