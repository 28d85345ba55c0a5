// SPDX-License-Identifier: GPL-2.0
/*
 * kloop's positive control for kmemleak (`--checks memory`,
 * CONFIG_DEBUG_KMEMLEAK): objects kmalloc'd and then forgotten. kmemleak
 * lists an object none of the memory it scans points to once it is
 * MSECS_MIN_AGE (5 s) old (mm/kmemleak.c, unreferenced_object()), with
 * the stack it was allocated from: this module's functions. Several are
 * leaked because kmemleak also scans every task's whole kernel stack
 * (kmemleak_scan(), kmemleak_stack_scan): a copy of the last pointer may
 * stay behind in the inserting task's stack and keep that one referenced;
 * the others have had their slot overwritten by the next iteration.
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>

#define KLOOP_CONTROL_LEAKS 4

static noinline void kloop_control_kmemleak_leak(void)
{
	int i;

	for (i = 0; i < KLOOP_CONTROL_LEAKS; i++) {
		char *p = kmalloc(200, GFP_KERNEL);

		if (!p)
			continue;
		strscpy(p, "kloop control leak", 200);
		/* The pointer is dropped here: nothing refers to the object. */
		OPTIMIZER_HIDE_VAR(p);
	}
}

static int __init kloop_control_kmemleak_init(void)
{
	kloop_control_kmemleak_leak();
	return 0;
}
module_init(kloop_control_kmemleak_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kloop positive control: kmalloc'd objects kmemleak must list");
