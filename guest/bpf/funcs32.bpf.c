// SPDX-License-Identifier: GPL-2.0
// kloop fixture "funcs32": one socket filter calling 31 distinct BPF-to-BPF
// subprograms, so the JIT emits 32 functions (main + 31) and the kernel
// registers 32 KSYMBOLs per load. The overhead scenario times it against
// "basic" (1 function) to see what each extra symbol costs with listeners.

#define SEC(name) __attribute__((section(name), used))
#define NOINLINE static __attribute__((noinline))

struct __sk_buff {
	unsigned int len;
};

// Every body mixes its own constants with runtime input, so clang can neither
// merge two subprograms nor fold a call away; noinline keeps each one a
// separate BPF function (and so a separate JITed image and KSYMBOL).
#define KLOOP_SUB(n)                                                        \
	NOINLINE unsigned int kloop_f##n(unsigned int x)                    \
	{                                                                   \
		return (x * (2654435761u + 2u * n)) ^ (x >> (n % 13 + 1)); \
	}

KLOOP_SUB(1)
KLOOP_SUB(2)
KLOOP_SUB(3)
KLOOP_SUB(4)
KLOOP_SUB(5)
KLOOP_SUB(6)
KLOOP_SUB(7)
KLOOP_SUB(8)
KLOOP_SUB(9)
KLOOP_SUB(10)
KLOOP_SUB(11)
KLOOP_SUB(12)
KLOOP_SUB(13)
KLOOP_SUB(14)
KLOOP_SUB(15)
KLOOP_SUB(16)
KLOOP_SUB(17)
KLOOP_SUB(18)
KLOOP_SUB(19)
KLOOP_SUB(20)
KLOOP_SUB(21)
KLOOP_SUB(22)
KLOOP_SUB(23)
KLOOP_SUB(24)
KLOOP_SUB(25)
KLOOP_SUB(26)
KLOOP_SUB(27)
KLOOP_SUB(28)
KLOOP_SUB(29)
KLOOP_SUB(30)
KLOOP_SUB(31)

SEC("socket")
int kloop_funcs32(struct __sk_buff *skb)
{
	unsigned int len = skb->len;
	unsigned int acc = 0;

	acc += kloop_f1(len);
	acc += kloop_f2(len);
	acc += kloop_f3(len);
	acc += kloop_f4(len);
	acc += kloop_f5(len);
	acc += kloop_f6(len);
	acc += kloop_f7(len);
	acc += kloop_f8(len);
	acc += kloop_f9(len);
	acc += kloop_f10(len);
	acc += kloop_f11(len);
	acc += kloop_f12(len);
	acc += kloop_f13(len);
	acc += kloop_f14(len);
	acc += kloop_f15(len);
	acc += kloop_f16(len);
	acc += kloop_f17(len);
	acc += kloop_f18(len);
	acc += kloop_f19(len);
	acc += kloop_f20(len);
	acc += kloop_f21(len);
	acc += kloop_f22(len);
	acc += kloop_f23(len);
	acc += kloop_f24(len);
	acc += kloop_f25(len);
	acc += kloop_f26(len);
	acc += kloop_f27(len);
	acc += kloop_f28(len);
	acc += kloop_f29(len);
	acc += kloop_f30(len);
	acc += kloop_f31(len);

	return (int)(acc & 0x7fffffff);
}

char _license[] SEC("license") = "GPL";
