// SPDX-License-Identifier: GPL-2.0
/*
 * kloop's positive control for lockdep (`--checks locking`,
 * CONFIG_PROVE_LOCKING): two mutexes taken A then B, released, then B
 * then A, by one task one after the other. Nothing can deadlock (no
 * other task holds either), but the second order closes a cycle in the
 * dependency graph lockdep built from the first: check_noncircular() ->
 * print_circular_bug() (kernel/locking/lockdep.c) reports "WARNING:
 * possible circular locking dependency detected" with this task's stack
 * at the acquisition, and the chain it found with the stack where A -> B
 * was first seen. lockdep then turns itself off for the rest of the boot
 * (debug_locks_off()), so this control runs in a boot of its own.
 */
#include <linux/module.h>
#include <linux/mutex.h>

static DEFINE_MUTEX(kloop_control_lock_a);
static DEFINE_MUTEX(kloop_control_lock_b);

static noinline void kloop_control_lockdep_a_then_b(void)
{
	mutex_lock(&kloop_control_lock_a);
	mutex_lock(&kloop_control_lock_b);
	mutex_unlock(&kloop_control_lock_b);
	mutex_unlock(&kloop_control_lock_a);
}

static noinline void kloop_control_lockdep_b_then_a(void)
{
	mutex_lock(&kloop_control_lock_b);
	mutex_lock(&kloop_control_lock_a);
	mutex_unlock(&kloop_control_lock_a);
	mutex_unlock(&kloop_control_lock_b);
}

static int __init kloop_control_lockdep_init(void)
{
	kloop_control_lockdep_a_then_b();
	kloop_control_lockdep_b_then_a();
	return 0;
}
module_init(kloop_control_lockdep_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kloop positive control: an AB-BA mutex order for lockdep");
