/*
 * iscsi-pattern: writes and checks a deterministic pattern on an iSCSI LUN
 * through libiscsi, for the integrity tests of oxhorn's iSCSI target
 * (tests/it/iscsi/). Built by hack/install-test-deps.sh; test tooling, not
 * product.
 *
 *   iscsi-pattern write  URL SEED FIRST_BLOCK BLOCKS [sync]
 *   iscsi-pattern verify URL SEED FIRST_BLOCK BLOCKS
 *
 * Each block's bytes follow from SEED and the block's address, so a block
 * written at the wrong place or left stale reads back wrong. `write` sends
 * WRITE(16)s of up to 64 blocks, then, with `sync`, SYNCHRONIZE CACHE(16)
 * over the range. The connection must not drop (no automatic reconnect):
 * any error, or any status but GOOD, ends the run with exit status 1 and a
 * line naming the block. Exit status 2: usage or login failed.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define CHUNK_BLOCKS 64

static uint64_t next(uint64_t *state)
{
	/* splitmix64 */
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void fill(unsigned char *block, uint32_t size, uint64_t seed, uint64_t lba)
{
	uint64_t state = seed * 0x100000001b3ULL ^ lba;
	for (uint32_t at = 0; at < size; at += 8) {
		uint64_t word = next(&state);
		memcpy(block + at, &word, 8);
	}
}

static int good(struct iscsi_context *iscsi, struct scsi_task *task, const char *what,
		uint64_t lba)
{
	if (task == NULL) {
		fprintf(stderr, "%s at block %" PRIu64 ": %s\n", what, lba, iscsi_get_error(iscsi));
		return 0;
	}
	if (task->status != SCSI_STATUS_GOOD) {
		fprintf(stderr, "%s at block %" PRIu64 ": status %d, sense %s/%s\n", what, lba,
			task->status, scsi_sense_key_str(task->sense.key),
			scsi_sense_ascq_str(task->sense.ascq));
		scsi_free_scsi_task(task);
		return 0;
	}
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 6 || (strcmp(argv[1], "write") && strcmp(argv[1], "verify"))) {
		fprintf(stderr, "usage: %s write|verify URL SEED FIRST_BLOCK BLOCKS [sync]\n", argv[0]);
		return 2;
	}
	int writing = !strcmp(argv[1], "write");
	int sync = argc > 6 && !strcmp(argv[6], "sync");
	uint64_t seed = strtoull(argv[3], NULL, 0);
	uint64_t first = strtoull(argv[4], NULL, 0);
	uint64_t blocks = strtoull(argv[5], NULL, 0);

	struct iscsi_context *iscsi = iscsi_create_context("iqn.2026-01.io.oxhorn.test:pattern");
	struct iscsi_url *url = iscsi ? iscsi_parse_full_url(iscsi, argv[2]) : NULL;
	if (url == NULL) {
		fprintf(stderr, "bad URL %s: %s\n", argv[2], iscsi ? iscsi_get_error(iscsi) : "");
		return 2;
	}
	iscsi_set_targetname(iscsi, url->target);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE_CRC32C);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", argv[2], iscsi_get_error(iscsi));
		return 2;
	}
	iscsi_set_noautoreconnect(iscsi, 1);
	struct scsi_task *capacity = iscsi_readcapacity16_sync(iscsi, url->lun);
	if (!good(iscsi, capacity, "READ CAPACITY(16)", 0))
		return 1;
	struct scsi_readcapacity16 *rc16 = scsi_datain_unmarshall(capacity);
	uint32_t size = rc16 ? rc16->block_length : 0;
	scsi_free_scsi_task(capacity);
	if (size == 0 || size % 8) {
		fprintf(stderr, "unexpected block size %" PRIu32 "\n", size);
		return 1;
	}

	unsigned char *buffer = malloc((size_t)size * CHUNK_BLOCKS);
	unsigned char *expected = malloc(size);
	for (uint64_t lba = first; lba < first + blocks; lba += CHUNK_BLOCKS) {
		uint32_t count = first + blocks - lba < CHUNK_BLOCKS ? first + blocks - lba : CHUNK_BLOCKS;
		uint32_t len = count * size;
		if (writing) {
			for (uint32_t i = 0; i < count; i++)
				fill(buffer + (size_t)i * size, size, seed, lba + i);
			struct scsi_task *task = iscsi_write16_sync(iscsi, url->lun, lba, buffer, len,
								    size, 0, 0, 0, 0, 0);
			if (!good(iscsi, task, "WRITE(16)", lba))
				return 1;
			scsi_free_scsi_task(task);
			continue;
		}
		struct scsi_task *task = iscsi_read16_sync(iscsi, url->lun, lba, len, size, 0, 0, 0,
							   0, 0);
		if (!good(iscsi, task, "READ(16)", lba))
			return 1;
		if (task->datain.size != (int)len) {
			fprintf(stderr, "READ(16) at block %" PRIu64 ": %d bytes, not %" PRIu32 "\n",
				lba, task->datain.size, len);
			return 1;
		}
		for (uint32_t i = 0; i < count; i++) {
			fill(expected, size, seed, lba + i);
			if (memcmp(task->datain.data + (size_t)i * size, expected, size)) {
				fprintf(stderr, "block %" PRIu64 " differs from what was written\n",
					lba + i);
				return 1;
			}
		}
		scsi_free_scsi_task(task);
	}
	if (writing && sync) {
		struct scsi_task *task = iscsi_synchronizecache16_sync(iscsi, url->lun, first,
								       (uint32_t)blocks, 0, 0);
		if (!good(iscsi, task, "SYNCHRONIZE CACHE(16)", first))
			return 1;
		scsi_free_scsi_task(task);
	}
	printf("%s %" PRIu64 " blocks from %" PRIu64 "\n", writing ? "wrote" : "verified", blocks,
	       first);
	free(buffer);
	free(expected);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	return 0;
}
