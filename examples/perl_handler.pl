#!/usr/bin/env perl
# An exec handler on the Gaffer::Exec library: price quotes from a preloaded catalogue.
#
#     [queues.quotes_perl]
#     handler = "exec"
#     start = "fork"          # or "spawn": the same program runs either way
#     command = ["perl", "examples/perl_handler.pl"]
#
# The catalogue is loaded before serve(): with start = "fork" that happens once per host,
# in the queue's language zygote, and every slot's process shares it copy-on-write; with
# "spawn" each slot loads its own copy.
#
#     payload: {"sku": "SKU-000042", "quantity": 3, "currency": "USD"}
#     result:  {"sku": "SKU-000042", "quantity": 3, "currency": "USD", "total": "1234.56"}
#
# An unknown sku or currency fails the task (retrying would not help). The library is
# found in sdk/perl/lib next to this file, or installed (sdk/perl/Makefile.PL).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../sdk/perl/lib";
use Gaffer::Exec;
use JSON::PP ();

my %RATES = (EUR => 1.0, USD => 1.08, GBP => 0.86, CHF => 0.95);

# Prices in euro cents by sku: the JSON file named by QUOTES_CATALOGUE, or a generated demo
# catalogue of 200,000 items.
sub load_catalogue {
    if (my $path = $ENV{QUOTES_CATALOGUE}) {
        open(my $file, '<:raw', $path) or die "cannot read $path: $!\n";
        local $/;
        return JSON::PP->new->utf8->decode(<$file>);
    }
    return { map { (sprintf('SKU-%06d', $_) => 100 + ($_ * 7919) % 100_000) } 0 .. 199_999 };
}

my $CATALOGUE = load_catalogue();

# One task's result entry, without its id.
sub quote {
    my ($payload) = @_;
    return { status => 'fail', error => 'the payload is not an object' } if ref $payload ne 'HASH';
    my ($sku, $currency, $quantity) = @$payload{qw(sku currency quantity)};
    $currency //= 'EUR';
    $quantity //= 1;
    return { status => 'fail', error => "unknown sku " . ($sku // 'null') }
        if !defined $sku || !exists $CATALOGUE->{$sku};
    return { status => 'fail', error => "unknown currency $currency" } if !exists $RATES{$currency};
    return { status => 'fail', error => "quantity $quantity is not a positive integer" }
        if $quantity !~ /\A[1-9][0-9]*\z/;
    my $cents = sprintf('%.0f', $CATALOGUE->{$sku} * $quantity * $RATES{$currency});
    return { status => 'ok', result => { sku => $sku, quantity => $quantity + 0,
        currency => $currency, total => sprintf('%d.%02d', int($cents / 100), $cents % 100) } };
}

sub handle {
    my ($tasks) = @_;
    my @results;
    for my $task (@$tasks) {
        # Asked to stop (the queue shrinks, the host drains): the tasks not yet started go
        # back to the queue, no attempt counted.
        last if Gaffer::Exec::should_stop();
        push @results, { id => $task->{id}, %{ quote($task->{payload}) } };
    }
    return \@results;
}

Gaffer::Exec::serve(\&handle);
